"""Progress of long tensor comparisons: plain lines on stderr, at most one every few seconds.

A comparison of a 700 GB checkpoint runs for an hour; in a CI log it must not be silent. The
pairs are compared in batches of about :data:`BATCH_BYTES`, and a
:class:`mtpcheck.ticker.Ticker` says how far it got: bytes done of the total, rate, time left,
the tensor it is at. Runs shorter than the interval print nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from mtpcheck.checks.tensor_match import Compare
from mtpcheck.model import Checkpoint, Prefetches, TensorComparison
from mtpcheck.ticker import Ticker

BATCH_BYTES = 256 * 2**20


def _pair_bytes(a: Checkpoint, b: Checkpoint, pair: tuple[str, str]) -> int:
    ma, mb = a.tensors.get(pair[0]), b.tensors.get(pair[1])
    return max(ma.nbytes if ma else 0, mb.nbytes if mb else 0)


def runs_of_bytes(costs: Sequence[int]) -> list[list[int]]:
    """Indices of ``costs``, in order, cut into runs of about :data:`BATCH_BYTES`."""
    runs: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, cost in enumerate(costs):
        current.append(i)
        held += cost
        if held >= BATCH_BYTES:
            runs.append(current)
            current, held = [], 0
    if current:
        runs.append(current)
    return runs


def _batches(
    a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
) -> list[tuple[list[tuple[str, str]], int]]:
    costs = [_pair_bytes(a, b, pair) for pair in pairs]
    return [([pairs[i] for i in run], sum(costs[i] for i in run)) for run in runs_of_bytes(costs)]


def _prefetch(ckpt: Checkpoint, names: list[str]) -> None:
    """Let a checkpoint read over the network fetch a batch's tensors at once (a Hub
    repository with ``--fetch``)."""
    if isinstance(ckpt, Prefetches):
        ckpt.prefetch(names)


def with_progress(
    compare: Compare,
    label: str,
    log: Callable[[str], None],
    interval: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Compare:
    """``compare`` that reports how far it got through ``log``."""

    def run(
        a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
    ) -> list[TensorComparison]:
        batches = _batches(a, b, pairs)
        ticker = Ticker(label, sum(n for _, n in batches), log, interval, clock)
        results: list[TensorComparison] = []
        for batch, nbytes in batches:
            _prefetch(a, [x for x, _ in batch])
            _prefetch(b, [y for _, y in batch])
            results += compare(a, b, batch)
            ticker.advance(nbytes, batch[-1][0])
        ticker.finish(f"{len(pairs)} tensors")
        return results

    return run
