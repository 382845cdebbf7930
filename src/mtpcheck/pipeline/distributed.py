"""``torchrun --nproc-per-node N -m mtpcheck diff A B``: the tensor list shared across ranks.

When ``WORLD_SIZE`` > 1 (torchrun, or srun + torchrun on a cluster), every rank opens both
checkpoints (headers only) and works out the same sorted tensor list; the list is split by
bytes (largest first, each tensor to the least loaded rank, deterministically), each rank reads
and compares only its share, and the comparisons are gathered over gloo (CPU, no GPU needed).
Every rank then holds the full list in the single-process order, so the report, the verdict
and the exit code are those of a single-process run. Rank 0 alone writes the report; the other
ranks print nothing to stdout, and every rank exits with rank 0's exit code.

torch is imported only here, and this module only when ``WORLD_SIZE`` > 1.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from mtpcheck.checks.diff_checks import diff_report
from mtpcheck.checks.tensor_match import compare_many
from mtpcheck.errors import ConfigError, ExitCode, HeaderError, InputError, MtpcheckError
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Checkpoint, Report, TensorComparison

TIMEOUT_ENV = "MTPCHECK_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 4 * 3600
"""How long a rank waits for the others at a collective (a large share takes a while)."""

_INPUT_ERRORS: dict[str, type[InputError]] = {
    c.__name__: c for c in (InputError, HeaderError, ConfigError)
}


def split_by_bytes(costs: Sequence[int], world: int) -> list[list[int]]:
    """Indices of ``costs`` per rank: largest first to the least loaded rank (ties: lowest
    index, lowest rank); each share in ascending index order. Deterministic."""
    loads = [0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        shares[rank].append(i)
        loads[rank] += costs[i]
    return [sorted(s) for s in shares]


def _cost(a: Checkpoint, b: Checkpoint, a_name: str, b_name: str) -> int:
    """Bytes a comparison reads (0 when metadata alone decides)."""
    ma, mb = a.tensors.get(a_name), b.tensors.get(b_name)
    if ma is None or mb is None or ma.dtype != mb.dtype or ma.shape != mb.shape:
        return 0
    return ma.nbytes


@dataclass(frozen=True)
class _Failure:
    """An exception of one rank, in a form every rank can rebuild."""

    rank: int
    kind: str
    """``input`` (an InputError and its subclass), ``mtpcheck``, ``interrupt`` or ``internal``."""
    name: str
    message: str
    path: str = ""
    reason: str = ""

    @classmethod
    def of(cls, rank: int, e: BaseException) -> _Failure:
        if isinstance(e, InputError):
            return cls(rank, "input", type(e).__name__, str(e), e.path, e.reason)
        if isinstance(e, MtpcheckError):
            return cls(rank, "mtpcheck", type(e).__name__, str(e))
        if isinstance(e, KeyboardInterrupt):
            return cls(rank, "interrupt", type(e).__name__, "")
        return cls(rank, "internal", type(e).__name__, str(e))

    def rebuild(self) -> BaseException:
        if self.kind == "input":
            return _INPUT_ERRORS.get(self.name, InputError)(self.path, self.reason)
        if self.kind == "mtpcheck":
            return MtpcheckError(self.message)
        if self.kind == "interrupt":
            return KeyboardInterrupt()
        return RuntimeError(f"rank {self.rank}: {self.name}: {self.message}")


class _Ranks:
    """The process group and the collectives the diff needs (gloo, objects)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        try:
            timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def close(self) -> None:
        self.dist.destroy_process_group()

    def gather(self, payload: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, payload)
        return out

    def settle(self, own: BaseException | None) -> None:
        """A collective: raise on every rank if any rank failed (its own exception first)."""
        failures = [f for f in self.gather(_Failure.of(self.rank, own) if own else None) if f]
        if own is not None:
            raise own
        if failures:
            raise failures[0].rebuild()

    def broadcast(self, value: int) -> int:
        box = [value]
        self.dist.broadcast_object_list(box, src=0)
        return int(box[0])


def _sharded_compare(ranks: _Ranks) -> Callable[..., list[TensorComparison]]:
    def compare(
        a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
    ) -> list[TensorComparison]:
        share = split_by_bytes([_cost(a, b, x, y) for x, y in pairs], ranks.world)[ranks.rank]
        failure: BaseException | None = None
        done: list[tuple[int, TensorComparison]] = []
        try:
            done = list(zip(share, compare_many(a, b, [pairs[i] for i in share]), strict=True))
        except BaseException as e:  # every rank must reach the collectives below
            failure = e
        ranks.settle(failure)
        results: list[TensorComparison | None] = [None] * len(pairs)
        for part in ranks.gather(done):
            for i, comparison in part:
                results[i] = comparison
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    return compare


def _quiet(build: Callable[[], Report]) -> int:
    """``execute`` for ranks > 0: the same exit code, no report and no repeated messages."""
    try:
        report = build()
    except MtpcheckError:
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as e:
        print(f"mtpcheck: rank {os.environ.get('RANK')}: internal error: {e!r}", file=sys.stderr)
        return ExitCode.INTERNAL
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def diff_across_ranks(
    a: Path,
    b: Path,
    all_tensors: bool,
    trust_pickle: bool,
    execute: Callable[[Callable[[], Report]], int],
) -> int:
    """Run ``mtpcheck diff`` as one rank of ``WORLD_SIZE``; returns rank 0's exit code.

    ``execute`` renders the report and maps outcomes to exit codes (the CLI's); it runs on
    rank 0 only.
    """
    ranks = _Ranks()
    try:

        def build() -> Report:
            opened: tuple[Checkpoint, Checkpoint] | None = None
            failure: BaseException | None = None
            try:
                opened = (open_checkpoint(a, trust_pickle), open_checkpoint(b, trust_pickle))
            except BaseException as e:  # every rank must reach the collective below
                failure = e
            ranks.settle(failure)
            assert opened is not None
            return diff_report(*opened, all_tensors=all_tensors, compare=_sharded_compare(ranks))

        code = execute(build) if ranks.rank == 0 else _quiet(build)
        sys.stdout.flush()
        sys.stderr.flush()
        # torchrun stops the other ranks (SIGTERM) as soon as one exits non-zero: the work is
        # done, so let every rank finish its exit with the common code instead
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = ranks.broadcast(int(code))
        ranks.dist.barrier()  # no rank exits before every rank ignores SIGTERM
        return code
    finally:
        ranks.close()
