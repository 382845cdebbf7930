"""What both round trips share: their options, the work directory, and how a conversion
stage ends (light: neither torch nor a converter is imported here)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import Checkpoint, CheckResult, Finding, Status
from mtpcheck.pipeline.converter_command import CommandResult


@dataclass(frozen=True)
class RoundtripOptions:
    """Everything a round trip needs; built by the CLI."""

    source: Path
    to_megatron: str | None = None
    to_hf: str | None = None
    to_drafter: str | None = None
    """A command taking the target's MTP layer out into a drafter format ({src}, {dst})."""
    from_drafter: str | None = None
    """A command writing that drafter back into the target ({src}, {drafter}, {dst})."""
    workdir: Path | None = None
    keep: bool = False
    timeout: float | None = None
    all_tensors: bool = False
    synthetic: bool = False
    trust_pickle: bool = False
    megatron_layout: MegatronLayout = MegatronLayout.MEGATRON_CORE
    """Whose modules the converter's Megatron checkpoint is saved from (stage 1's mapping)."""


def stage_check(name: str, title: str, result: CommandResult, stage: str) -> CheckResult:
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
    return CheckResult("output", f"{stage}: output readable", (finding,))


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
