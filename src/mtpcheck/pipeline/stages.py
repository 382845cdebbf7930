"""What both round trips share: their options, the work directory, and how a conversion
stage ends (light: neither torch nor a converter is imported here)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import CheckName, Checkpoint, CheckResult, Finding, Status
from mtpcheck.pipeline.converter_command import CommandResult
from mtpcheck.pipeline.options import RoundtripOptions


def stage_check(name: CheckName, title: str, result: CommandResult, stage: str) -> CheckResult:
    """How one conversion stage ended: PASS with its time, or FAIL with the converter's last
    lines."""
    seconds = round(result.seconds, 3)
    if result.ok:
        finding = Finding(stage, Status.PASS, result.message, {"seconds": seconds})
        return CheckResult(name, title, (finding,))
    details = {"stderr_tail": result.stderr_tail, "seconds": seconds}
    tail = f"; stderr tail:\n{result.stderr_tail}" if result.stderr_tail else ""
    message = f"converter {result.message}{tail}"
    return CheckResult(name, title, (Finding(stage, Status.FAIL, message, details),))


def unreadable_check(stage: str, error: str) -> CheckResult:
    """A stage that ended well and left what cannot be opened."""
    finding = Finding(stage, Status.FAIL, f"converter output is unreadable: {error}")
    return CheckResult(CheckName.OUTPUT, f"{stage}: output readable", (finding,))


def try_open(path: Path, trust_pickle: bool) -> tuple[Checkpoint | None, str | None]:
    """The opened checkpoint, or why it cannot be opened."""
    try:
        return open_checkpoint(path, trust_pickle), None
    except InputError as e:
        return None, str(e)


def make_workdir(opts: RoundtripOptions) -> Path:
    """A fresh folder under ``--workdir`` (default: the system temp dir)."""
    root = opts.workdir or Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="mtpcheck-roundtrip-", dir=root))


def release_workdir(opts: RoundtripOptions, work: Path) -> None:
    """Remove the work directory, or say where it is kept (``--keep``): on stderr even with
    ``--quiet``, which silences progress, not what the user asked for."""
    if opts.keep:
        print(f"mtpcheck: kept the round trip's checkpoints in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
