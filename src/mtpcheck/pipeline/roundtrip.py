"""``mtpcheck roundtrip``: HF -> Megatron -> HF through checkpoints on disk, then checks."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from mtpcheck.checks.roundtrip_checks import (
    STAGE1,
    STAGE2,
    stage1_checks,
    stage2_checks,
    summary_of,
)
from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Checkpoint, CheckResult, Finding, Report, Status
from mtpcheck.pipeline.converter_command import CommandResult, run_command

DISK_MARGIN = 1.1


@dataclass(frozen=True)
class RoundtripOptions:
    """Everything a round trip needs; built by the CLI."""

    source: Path
    to_megatron: str | None = None
    to_hf: str | None = None
    workdir: Path | None = None
    keep: bool = False
    timeout: float | None = None
    all_tensors: bool = False
    synthetic: bool = False
    trust_pickle: bool = False


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """CI cancels jobs with SIGTERM: treat it like Ctrl-C so temporary files go."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_disk(root: Path, needed: int) -> None:
    free = shutil.disk_usage(root).free
    if free < needed:
        raise InputError(
            root,
            f"not enough free disk for the round trip: needs about {needed / 2**30:.2f} GiB, "
            f"{free / 2**30:.2f} GiB free (use --workdir elsewhere)",
        )


def _stage(name: str, title: str, result: CommandResult, stage: str) -> CheckResult:
    if result.ok:
        return CheckResult(name, title, (Finding(stage, Status.PASS, result.message),))
    details = {"stderr_tail": result.stderr_tail}
    tail = f"; stderr tail:\n{result.stderr_tail}" if result.stderr_tail else ""
    message = f"converter {result.message}{tail}"
    return CheckResult(name, title, (Finding(stage, Status.FAIL, message, details),))


def _builtin(action: Callable[[], None], dst: Path) -> CommandResult:
    start = time.monotonic()
    try:
        action()
    except MtpcheckError as e:
        return CommandResult(False, f"failed: {e}", "", time.monotonic() - start)
    seconds = time.monotonic() - start
    return CommandResult(
        True, f"built-in converter wrote {dst.name}/ in {seconds:.1f} s", "", seconds
    )


def _open_output(
    path: Path, stage: str, trust_pickle: bool
) -> tuple[Checkpoint | None, CheckResult | None]:
    try:
        return open_checkpoint(path, trust_pickle), None
    except InputError as e:
        finding = Finding(stage, Status.FAIL, f"converter output is unreadable: {e}")
        return None, CheckResult("output", f"{stage}: output readable", (finding,))


def run_roundtrip(opts: RoundtripOptions, log: Callable[[str], None]) -> Report:
    """Run both stages in a temporary directory that is always removed unless ``keep``."""
    root = opts.workdir or Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mtpcheck-roundtrip-", dir=root))
    try:
        with _sigterm_as_interrupt():
            report = _run(opts, work, log)
    finally:
        if opts.keep:
            log(f"kept the round trip's checkpoints in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return report


def _run(opts: RoundtripOptions, work: Path, log: Callable[[str], None]) -> Report:
    from mtpcheck.convert import builtin

    if opts.synthetic:
        from mtpcheck.convert.synthetic import build_synthetic

        log(f"building a synthetic checkpoint from {opts.source}")
        source_path = build_synthetic(opts.source, work / "synthetic")
    else:
        source_path = opts.source
    source = open_checkpoint(source_path)
    check_disk(work, int(DISK_MARGIN * 2 * sum(m.nbytes for m in source.tensors.values())))

    megatron_dir = work / "megatron"
    log(f"{STAGE1}: converting into {megatron_dir}")
    if opts.to_megatron:
        stage1 = run_command(opts.to_megatron, source_path, megatron_dir, opts.timeout)
    else:
        # intermediates are read back and deleted: no fsync (like cp, they may never hit disk)
        stage1 = _builtin(
            lambda: builtin.hf_to_megatron(source, megatron_dir, durable=False), megatron_dir
        )
    checks: list[CheckResult] = [_stage("stage1-convert", "Stage 1: converter", stage1, STAGE1)]
    inputs = [summary_of(source)]
    if not stage1.ok:
        return Report("roundtrip", tuple(inputs), tuple(checks))
    megatron, unreadable = _open_output(megatron_dir, STAGE1, opts.trust_pickle)
    if megatron is None:
        assert unreadable is not None
        return Report("roundtrip", tuple(inputs), (*checks, unreadable))
    inputs.append(summary_of(megatron))
    first, stage1_results, expected = stage1_checks(source, megatron)
    checks += first

    final_dir = work / "hf"
    log(f"{STAGE2}: converting into {final_dir}")
    if opts.to_hf:
        stage2 = run_command(opts.to_hf, megatron_dir, final_dir, opts.timeout)
    else:
        copies = any(c in source.tensors for c, _ in expected.plan.copies)
        stage2 = _builtin(
            lambda: builtin.megatron_to_hf(
                megatron, final_dir, dict(source.config), copies, durable=False
            ),
            final_dir,
        )
    checks.append(_stage("stage2-convert", "Stage 2: converter", stage2, STAGE2))
    if not stage2.ok:
        return Report("roundtrip", tuple(inputs), tuple(checks))
    final, unreadable = _open_output(final_dir, STAGE2, opts.trust_pickle)
    if final is None:
        assert unreadable is not None
        return Report("roundtrip", tuple(inputs), (*checks, unreadable))
    inputs.append(summary_of(final))
    second, comparisons = stage2_checks(source, final, stage1_results, expected, opts.all_tensors)
    checks += second
    return Report("roundtrip", tuple(inputs), tuple(checks), comparisons)
