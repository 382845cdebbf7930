"""``torchrun --nproc-per-node N -m mtpcheck diff A B`` (or ``roundtrip SRC``): the tensor
list shared across ranks.

When ``WORLD_SIZE`` > 1 (torchrun, or srun + torchrun on a cluster), every rank opens both
checkpoints (headers only) and works out the same sorted tensor list; the list is split by
bytes (largest first, each tensor to the least loaded rank, deterministically), each rank reads
and compares only its share, and the comparisons are gathered over gloo (CPU, no GPU needed).
Every rank then holds the full list in the single-process order, so the report, the verdict
and the exit code are those of a single-process run. Rank 0 alone writes the report; the other
ranks print nothing to stdout, and every rank exits with rank 0's exit code.

``roundtrip``: rank 0 alone runs both conversion stages in its work directory, before it joins
the process group (the built-in converter needs a one-rank group of its own), while the others
wait for it at the rendezvous; it then broadcasts what the stages left, every rank opens those
checkpoints and the comparisons of both stages are split as above. The work directory must be
on a file system every rank sees; rank 0 removes it once every rank is done (unless ``--keep``).

torch is imported only here, and this module only when ``WORLD_SIZE`` > 1.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, cast

from mtpcheck.checks.diff_checks import diff_report
from mtpcheck.checks.tensor_match import compare_many
from mtpcheck.errors import ConfigError, ExitCode, HeaderError, InputError, MtpcheckError
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Checkpoint, Report, TensorComparison
from mtpcheck.pipeline.options import RoundtripOptions
from mtpcheck.pipeline.output_dir import sigterm_as_interrupt
from mtpcheck.pipeline.progress import runs_of_bytes
from mtpcheck.pipeline.roundtrip import Conversions, Opened, check, convert, open_outputs
from mtpcheck.pipeline.stages import make_workdir, release_workdir
from mtpcheck.settings import DIST_TIMEOUT
from mtpcheck.ticker import Ticker

_TORCHRUN_ENV = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}
"""What torchrun sets for its workers (besides ``TORCHELASTIC_*``)."""

POLL_S = 1.0
"""How often rank 0 reads the other ranks' progress from the store."""

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
        # how long a rank waits for the others at a collective (a large share takes a while)
        timeout = DIST_TIMEOUT.given()
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.calls = 0
        """Sharded comparisons so far (each posts its progress under its own store key)."""

    def store(self) -> Any:
        """The rendezvous key-value store, or ``None`` where torch does not expose it."""
        try:
            from torch.distributed import distributed_c10d

            return distributed_c10d._get_default_store()
        except Exception:
            return None

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
        return int(self.share(value))

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]


class _SharedProgress:
    """Whole-job progress of one sharded comparison: every rank posts the bytes it has compared
    to the rendezvous store (no collective, so no rank waits for it); on rank 0 a thread sums
    them every :data:`POLL_S` and reports the whole through a :class:`Ticker`."""

    def __init__(
        self, ranks: _Ranks, key: str, shares: list[int], log: Callable[[str], None] | None
    ) -> None:
        self.ranks, self.key, self.shares = ranks, key, shares
        self.store = ranks.store()
        self.stop = threading.Event()
        self.reported = 0
        self.thread: threading.Thread | None = None
        if ranks.rank == 0 and log is not None and self.store is not None:
            label = f"comparing on {ranks.world} ranks"
            self.ticker = Ticker(label, sum(shares), log)
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def post(self, done: int) -> None:
        if self.store is not None:
            self.store.set(f"{self.key}/{self.ranks.rank}", str(done))

    def _read(self) -> list[int]:
        assert self.store is not None
        done = []
        for rank in range(self.ranks.world):
            key = f"{self.key}/{rank}"
            done.append(int(self.store.get(key)) if self.store.check([key]) else 0)
        return done

    def report(self) -> None:
        """Rank 0: what every rank has posted so far, through the ticker."""
        done = self._read()
        finished = sum(d >= s for d, s in zip(done, self.shares, strict=True))
        self.ticker.advance(sum(done) - self.reported, f"{finished} of {len(done)} ranks done")
        self.reported = sum(done)

    def _watch(self) -> None:
        try:
            while not self.stop.wait(POLL_S):
                self.report()
        except Exception:  # progress is a courtesy: a store hiccup must not stop the work
            return

    def close(self, pairs: int) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.ticker.finish(f"{pairs} tensors")


def _sharded_compare(
    ranks: _Ranks, log: Callable[[str], None] | None = None
) -> Callable[..., list[TensorComparison]]:
    def compare(
        a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
    ) -> list[TensorComparison]:
        costs = [_cost(a, b, x, y) for x, y in pairs]
        shares = split_by_bytes(costs, ranks.world)
        share = shares[ranks.rank]
        ranks.calls += 1
        progress = _SharedProgress(
            ranks,
            f"mtpcheck/progress/{ranks.calls}",
            [sum(costs[i] for i in s) for s in shares],
            log,
        )
        failure: BaseException | None = None
        done: list[tuple[int, TensorComparison]] = []
        try:
            compared = 0
            for run in runs_of_bytes([costs[i] for i in share]):  # one post to the store each
                batch = [share[j] for j in run]
                found = compare_many(a, b, [pairs[i] for i in batch])
                done += zip(batch, found, strict=True)
                compared += sum(costs[i] for i in batch)
                progress.post(compared)
        except BaseException as e:  # every rank must reach the collectives below
            failure = e
        try:
            ranks.settle(failure)
            results: list[TensorComparison | None] = [None] * len(pairs)
            for part in ranks.gather(done):
                for i, comparison in part:
                    results[i] = comparison
        finally:
            progress.close(len(pairs))
        assert all(r is not None for r in results)
        return cast(list[TensorComparison], results)

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


def _exit_together(ranks: _Ranks, code: int) -> int:
    """Rank 0's exit code on every rank, once every rank is done."""
    sys.stdout.flush()
    sys.stderr.flush()
    # torchrun stops the other ranks (SIGTERM) as soon as one exits non-zero: the work is
    # done, so let every rank finish its exit with the common code instead
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = ranks.broadcast(int(code))
    ranks.dist.barrier()  # no rank exits before every rank ignores SIGTERM
    return code


def diff_across_ranks(
    a: Path,
    b: Path,
    all_tensors: bool,
    trust_pickle: bool,
    execute: Callable[[Callable[[], Report]], int],
    log: Callable[[str], None] | None = None,
) -> int:
    """Run ``mtpcheck diff`` as one rank of ``WORLD_SIZE``; returns rank 0's exit code.

    ``execute`` renders the report and maps outcomes to exit codes (the CLI's); it runs on
    rank 0 only. ``log``: rank 0's progress of the whole comparison.
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
            return diff_report(
                *opened, all_tensors=all_tensors, compare=_sharded_compare(ranks, log)
            )

        code = execute(build) if ranks.rank == 0 else _quiet(build)
        return _exit_together(ranks, code)
    finally:
        ranks.close()


def _env_rank() -> int:
    """This process's rank, known before the process group exists."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        raise RuntimeError("RANK is not set: start the ranks with torchrun") from None


@contextmanager
def _single_process_env() -> Iterator[None]:
    """Without torchrun's variables, as a single-process run: a converter that uses
    torch.distributed must not try to join this job's rendezvous."""
    saved = {
        k: v for k, v in os.environ.items() if k in _TORCHRUN_ENV or k.startswith("TORCHELASTIC_")
    }
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


def _convert_alone(
    opts: RoundtripOptions, log: Callable[[str], None]
) -> tuple[Path | None, tuple[Conversions, Opened] | None, BaseException | None]:
    """Rank 0's conversion stages: the work directory (``None`` once released), what the
    stages left and the checkpoints opened on the way, or the exception to report once the
    ranks meet."""
    work: Path | None = None
    try:
        work = make_workdir(opts)
        with sigterm_as_interrupt(), _single_process_env():
            return work, convert(opts, work, log), None
    except BaseException as e:  # every rank must learn it at the rendezvous
        if work is not None:  # nothing left to read
            release_workdir(opts, work)
        return None, None, e


def _shared_paths_hint(rank: int, e: BaseException) -> BaseException:
    if rank == 0 or not isinstance(e, InputError):
        return e
    return type(e)(
        e.path,
        f"{e.reason} (on rank {rank}: every rank must see the same paths; "
        "put --workdir on a file system all nodes share)",
    )


def _check_across(
    ranks: _Ranks,
    failure: BaseException | None,
    conversions: Conversions | None,
    opts: RoundtripOptions,
    log: Callable[[str], None],
    opened: Opened | None = None,
) -> Report:
    """Every rank: rank 0's outcome of the conversions, then the checks, compared in shares.
    ``opened``: the checkpoints rank 0 already opened while converting."""
    ranks.settle(failure)  # rank 0's failure, if any, raised on every rank
    shared: Conversions = ranks.share(conversions)
    unopened: BaseException | None = None
    try:
        if opened is None:
            opened = open_outputs(shared, opts.trust_pickle)
    except BaseException as e:  # every rank must reach the collective below
        unopened = _shared_paths_hint(ranks.rank, e)
    ranks.settle(unopened)
    assert opened is not None
    return check(shared, opened, opts.all_tensors, _sharded_compare(ranks, log))


def roundtrip_across_ranks(
    opts: RoundtripOptions,
    log: Callable[[str], None],
    execute: Callable[[Callable[[], Report]], int],
) -> int:
    """Run ``mtpcheck roundtrip`` as one rank of ``WORLD_SIZE``; returns rank 0's exit code.

    Rank 0 converts before it joins the process group; the others wait for it there (up to
    ``MTPCHECK_DIST_TIMEOUT``). ``execute`` as in :func:`diff_across_ranks`.
    """
    work, converted, failure = None, None, None
    if _env_rank() == 0:
        work, converted, failure = _convert_alone(opts, log)
    conversions, opened = converted or (None, None)
    ranks: _Ranks | None = None
    try:
        with sigterm_as_interrupt():  # until the end, a SIGTERM still removes the work directory
            ranks = _Ranks()
            build = partial(_check_across, ranks, failure, conversions, opts, log, opened)
            code = execute(build) if ranks.rank == 0 else _quiet(build)
        return _exit_together(ranks, code)
    finally:
        if ranks is not None:
            ranks.close()
        if work is not None:  # every rank has passed the final barrier, or failed
            release_workdir(opts, work)
