"""``mtpcheck roundtrip TARGET --to-drafter CMD --from-drafter CMD``: a target's MTP layer
taken out into a drafter format and written back (speculators' ``convert --algorithm mtp``
and ``stitch-mtp``), through checkpoints on disk.

Stage 1's drafter is compared with the target's MTP layer in the drafter's names (an
extraction's scope, :mod:`mtpcheck.checks.drafter_mtp`); stage 2's target with the original
(the MTP scope, every tensor with ``--all``). Neither stage needs torch here: the tools run in
their own processes.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from mtpcheck.checks.diff_checks import diff_report
from mtpcheck.checks.drafter_mtp import mtp_extract_check
from mtpcheck.checks.inspect_checks import inspect_report
from mtpcheck.checks.tensor_match import compare_many
from mtpcheck.families import analyse
from mtpcheck.families.drafters import recognise
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import CheckName, CheckResult, Finding, Report, Status
from mtpcheck.pipeline.converter_command import CommandResult, run_command
from mtpcheck.pipeline.options import DRAFTER_PLACEHOLDER, RoundtripOptions
from mtpcheck.pipeline.output_dir import sigterm_as_interrupt
from mtpcheck.pipeline.progress import with_progress
from mtpcheck.pipeline.stages import (
    make_workdir,
    release_workdir,
    stage_check,
    try_open,
    unreadable_check,
)


def _converter(
    template: str, src: Path, dst: Path, opts: RoundtripOptions, log: Callable[[str], None], n: int
) -> CommandResult:
    return run_command(
        template, src, dst, opts.timeout, on_line=lambda line: log(f"stage {n} converter | {line}")
    )


def run_drafter_roundtrip(opts: RoundtripOptions, log: Callable[[str], None]) -> Report:
    """Run both stages in a temporary directory that is always removed unless ``keep``."""
    assert opts.to_drafter is not None and opts.from_drafter is not None
    work = make_workdir(opts)
    try:
        with sigterm_as_interrupt():
            return _trip(opts, opts.to_drafter, opts.from_drafter, work, log)
    finally:
        release_workdir(opts, work)


def _trip(
    opts: RoundtripOptions, out: str, back: str, work: Path, log: Callable[[str], None]
) -> Report:
    source = open_checkpoint(opts.source, opts.trust_pickle)
    audit = inspect_report(source)
    checks: list[CheckResult] = list(audit.checks)
    if not audit.ok:
        return Report("roundtrip", audit.inputs, tuple(checks))
    compare = with_progress(compare_many, "comparing", log)
    drafter_dir, final_dir = work / "drafter", work / "final"
    first = _converter(out, opts.source, drafter_dir, opts, log, 1)
    checks.append(stage_check(CheckName.STAGE1, "Stage 1: target -> drafter", first, "stage 1"))
    drafter, why = try_open(drafter_dir, opts.trust_pickle) if first.ok else (None, None)
    if why is not None:
        checks.append(unreadable_check("stage 1", why))
    if drafter is None:
        return Report("roundtrip", audit.inputs, tuple(checks))
    kind = recognise(drafter.config, drafter.tensors)
    if kind is None or not kind.mtp_extract:
        said = kind.display if kind else "no drafter kind mtpcheck knows"
        checks.append(
            CheckResult(
                CheckName.DRAFTER_MTP,
                "Drafter against the target's MTP layer",
                (Finding("stage 1", Status.FAIL, f"stage 1 wrote {said}, not an MTP layer"),),
            )
        )
        return Report("roundtrip", audit.inputs, tuple(checks))
    analysis = analyse(source.config, source.tensors, source.config_path)
    extracted, comparisons = mtp_extract_check(drafter, kind, source, analysis, compare)
    checks.append(extracted)
    stitch = back.replace(DRAFTER_PLACEHOLDER, shlex.quote(str(drafter_dir)))
    second = _converter(stitch, opts.source, final_dir, opts, log, 2)
    checks.append(stage_check(CheckName.STAGE2, "Stage 2: drafter -> target", second, "stage 2"))
    final, why = try_open(final_dir, opts.trust_pickle) if second.ok else (None, None)
    if why is not None:
        checks.append(unreadable_check("stage 2", why))
    if final is None:
        return Report("roundtrip", audit.inputs, tuple(checks), tensors=comparisons)
    back_diff = diff_report(source, final, all_tensors=opts.all_tensors, compare=compare)
    checks += [c for c in back_diff.checks if c.name is not CheckName.INTEGRITY]
    return Report("roundtrip", audit.inputs, tuple(checks), tensors=back_diff.tensors)
