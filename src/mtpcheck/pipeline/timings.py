"""How long each part of a round trip took, for benchmarks: an internal channel, off by default.

With ``MTPCHECK_TIMINGS=FILE`` in the environment, ``roundtrip`` writes FILE (JSON) as it
ends: one entry per part it ran, in order, each with its seconds and the bytes it wrote or
read, so that a benchmark can tell the conversions, the comparisons and the clean-up apart
(and rate each against the disk). The report itself is unchanged; without the variable
nothing is measured or written. ::

    {"stages": [{"stage": "stage1-convert", "seconds": 2.1, "bytes": 2097152000}, ...]}

Parts: ``source-audit`` (opening the source and ``inspect``'s checks), ``stage1-import`` (the
built-in stage 1 importing megatron-core's writer: seconds, not disk), ``stage1-convert`` and
``stage2-convert`` (bytes: what the stage wrote), ``stage1-open`` and ``stage2-open`` (the
headers of what it wrote), ``compare-stage1`` and ``compare-stage2`` (bytes: both sides of
the tensors compared), ``cleanup`` (removing the work directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtpcheck.checks.tensor_match import Compare
from mtpcheck.model import Checkpoint, TensorComparison
from mtpcheck.settings import TIMINGS

COMPARE_STAGES = ("compare-stage1", "compare-stage2")
"""What the round trip's comparison calls are, in the order it makes them (one per stage)."""


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ``root`` (0 if it is gone)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
    return total


@dataclass
class StageClock:
    """The parts of one round trip as they ran; :meth:`write` saves them to ``path``."""

    path: Path
    stages: list[dict[str, str | float | int]] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def from_env(cls) -> StageClock | None:
        """A clock writing to ``$MTPCHECK_TIMINGS``; None when the variable is unset or empty."""
        where = TIMINGS.value()
        return cls(where) if where is not None else None

    def add(self, stage: str, seconds: float, nbytes: int = 0) -> None:
        """Record ``stage`` as having taken ``seconds`` (and written ``nbytes``)."""
        self.stages.append({"stage": stage, "seconds": round(seconds, 6), "bytes": nbytes})

    @contextlib.contextmanager
    def timed(self, stage: str, nbytes: int = 0) -> Iterator[None]:
        """Record the time the block takes as ``stage`` (also when it raises)."""
        start = self.clock()
        try:
            yield
        finally:
            self.add(stage, self.clock() - start, nbytes)

    def timed_compare(self, compare: Compare, names: Sequence[str] = COMPARE_STAGES) -> Compare:
        """``compare`` recording each call as the next of ``names`` (then ``compare-N``), with
        the bytes of both sides of the pairs it was given."""
        calls = iter(names)

        def run(
            a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
        ) -> Sequence[TensorComparison]:
            stage = next(calls, f"compare-{len(self.stages)}")
            with self.timed(stage):
                results = compare(a, b, pairs)
            self.stages[-1]["bytes"] = _pair_bytes(a, b, pairs)
            return results

        return run

    def write(self) -> None:
        """Save the parts recorded so far as JSON (replacing the file)."""
        self.path.write_text(json.dumps({"stages": self.stages}, indent=1) + "\n")


def _pair_bytes(a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]) -> int:
    total = 0
    for x, y in pairs:
        ma, mb = a.tensors.get(x), b.tensors.get(y)
        total += (ma.nbytes if ma else 0) + (mb.nbytes if mb else 0)
    return total
