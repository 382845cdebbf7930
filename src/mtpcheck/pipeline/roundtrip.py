"""``mtpcheck roundtrip``: HF -> Megatron -> HF through checkpoints on disk, then checks.

Two phases: ``convert`` runs both conversion stages (no tensor compared), ``check`` opens what
they wrote (headers only) and compares. Under torchrun rank 0 alone converts and every rank
checks its share of the tensors (``mtpcheck.pipeline.distributed``).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from mtpcheck.checks.roundtrip_checks import (
    STAGE1,
    STAGE2,
    final_count_check,
    final_main_model_check,
    source_check,
    source_checks,
    stage1_checks,
    stage2_checks,
    summary_of,
)
from mtpcheck.checks.tensor_match import Compare, compare_many
from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.families import MtpFamily, detect_family
from mtpcheck.formats import open_checkpoint
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    Report,
    Status,
    total_nbytes,
)
from mtpcheck.pipeline.converter_command import CommandResult, run_command
from mtpcheck.pipeline.main_model import mcore_model_check
from mtpcheck.pipeline.memory import release_free_memory
from mtpcheck.pipeline.options import RoundtripOptions
from mtpcheck.pipeline.output_dir import sigterm_as_interrupt
from mtpcheck.pipeline.progress import with_progress
from mtpcheck.pipeline.stages import (
    make_workdir,
    release_workdir,
    stage_check,
    try_open,
    unreadable_check,
)
from mtpcheck.pipeline.timings import StageClock, tree_bytes

DISK_MARGIN = 1.1
WRITER_THREADS = 2
"""Threads (and ``.distcp`` files) of the built-in stage 1's torch_dist save: megatron-core's
own default, and what keeps the disk busy while one thread waits for the kernel."""


def check_disk(root: Path, needed: int) -> None:
    """Refuse (exit 2) a work directory without ``needed`` bytes free."""
    free = shutil.disk_usage(root).free
    if free < needed:
        raise InputError(
            root,
            f"not enough free disk for the round trip: needs about {needed / 2**30:.2f} GiB, "
            f"{free / 2**30:.2f} GiB free (use --workdir elsewhere)",
        )


def _builtin(action: Callable[[], object], dst: Path) -> CommandResult:
    start = time.monotonic()
    try:
        action()
    except MtpcheckError as e:
        return CommandResult(False, f"failed: {e}", "", time.monotonic() - start)
    finally:
        release_free_memory()  # what the converter freed, before the next stage allocates
    seconds = time.monotonic() - start
    return CommandResult(
        True, f"built-in converter wrote {dst.name}/ in {seconds:.1f} s", "", seconds
    )


@dataclass(frozen=True)
class StageRun:
    """One conversion stage as it ran (picklable: rank 0 broadcasts it under torchrun)."""

    result: CommandResult
    output: Path
    unreadable: str | None = None
    """Why the output of a successful run cannot be opened."""

    @property
    def readable(self) -> bool:
        """The stage succeeded and its output can be opened."""
        return self.result.ok and self.unreadable is None


@dataclass(frozen=True)
class Conversions:
    """What the conversion stages left in the work directory for the checks."""

    source: Path
    """The checkpoint converted (the synthetic one, with ``--synthetic``)."""
    source_audit: tuple[CheckResult, ...]
    """Stage 0: ``inspect``'s checks on the source, run before anything is converted."""
    stage1: StageRun | None
    """``None``: not run, the source fails its audit."""
    stage2: StageRun | None
    """``None``: not run, stage 1 did not run or left nothing readable."""
    label: str | None = None
    """How the report names the source when it is not a path the user gave (``--synthetic``:
    the temporary checkpoint is gone by the time the report is read)."""


@dataclass(frozen=True)
class Opened:
    """The checkpoints the checks read: each output only where its stage left it readable."""

    source: Checkpoint
    megatron: Checkpoint | None
    final: Checkpoint | None


def run_roundtrip(opts: RoundtripOptions, log: Callable[[str], None]) -> Report:
    """Run both stages in a temporary directory that is always removed unless ``keep``.

    With ``MTPCHECK_TIMINGS`` set, the time of each part goes to that file
    (:mod:`mtpcheck.pipeline.timings`)."""
    clock = StageClock.from_env()
    work = make_workdir(opts)
    try:
        with sigterm_as_interrupt():
            conversions, opened = convert(opts, work, log, clock)
            compare = with_progress(compare_many, "comparing", log)
            if clock is not None:
                compare = clock.timed_compare(compare)
            report = check(conversions, opened, opts.all_tensors, compare, opts.megatron_layout)
    finally:
        with _timed(clock, "cleanup"):
            release_workdir(opts, work)
        if clock is not None:
            clock.write()
    return report


def _timed(clock: StageClock | None, stage: str) -> contextlib.AbstractContextManager[None]:
    """``clock.timed(stage)``, or nothing without a clock."""
    return clock.timed(stage) if clock is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _timed_stage(clock: StageClock | None, stage: str, output: Path) -> Iterator[None]:
    """Time a conversion stage, with the bytes it left in ``output``."""
    if clock is None:
        yield
        return
    with clock.timed(stage):
        yield
    clock.stages[-1]["bytes"] = tree_bytes(output)


def _user_converter(
    template: str,
    src: Path,
    dst: Path,
    opts: RoundtripOptions,
    log: Callable[[str], None],
    stage: int,
) -> CommandResult:
    """Run the user's converter command for ``stage``, its output lines logged as they come."""
    return run_command(
        template,
        src,
        dst,
        opts.timeout,
        on_line=lambda line: log(f"stage {stage} converter | {line}"),
    )


def convert(
    opts: RoundtripOptions,
    work: Path,
    log: Callable[[str], None],
    clock: StageClock | None = None,
) -> tuple[Conversions, Opened]:
    """Run both conversion stages into ``work``; stage 2 only if stage 1 wrote something
    readable. No tensor is compared here. Also returns the checkpoints it opened on the way
    (other ranks open them again with :func:`open_outputs`). ``clock`` records how long each
    part took."""
    from mtpcheck.convert import builtin

    source_path, label = _source_path(opts, work, log)
    with _timed(clock, "source-audit"):
        source = open_checkpoint(source_path)
        audit = _audit(source)
    if any(c.status is Status.FAIL for c in audit):
        log("the source fails its audit: nothing converted")
        return Conversions(source_path, audit, None, None, label), Opened(source, None, None)
    _require_mapping(source, opts.source)  # stage 1 is judged by it: before any converter
    if not opts.to_megatron or not opts.to_hf:
        builtin.require_writable(source)  # the built-in stages need a writer for the family
    check_disk(work, int(DISK_MARGIN * 2 * total_nbytes(source.tensors)))

    converting = _Converting(opts, source, log, clock)
    stage1, megatron = _stage1(converting, source_path, work / "megatron")
    if megatron is None:
        return Conversions(source_path, audit, stage1, None, label), Opened(source, None, None)
    stage2, final = _stage2(converting, stage1.output, megatron, work / "hf")
    return Conversions(source_path, audit, stage1, stage2, label), Opened(source, megatron, final)


def _source_path(
    opts: RoundtripOptions, work: Path, log: Callable[[str], None]
) -> tuple[Path, str | None]:
    """The checkpoint to convert, and how the report names it where that is not the path
    the user gave (``--synthetic``: one built from it in ``work``, once the family is known
    to be one the round trip can judge and, without converters of the user's, write)."""
    if not opts.synthetic:
        return opts.source, None
    from mtpcheck.convert import builtin
    from mtpcheck.convert.synthetic import build_synthetic, synthetic_config
    from mtpcheck.mapping import MappingError
    from mtpcheck.mapping.plan import mappable_family

    config_path, config, family = synthetic_config(opts.source)
    try:
        mappable_family(config)
    except MappingError as e:
        raise _unjudged(e, config_path, opts.source, family) from e
    if not opts.to_megatron or not opts.to_hf:
        builtin.writer_family(config, str(config_path))
    log(f"building a synthetic checkpoint from {opts.source}")
    source_path = build_synthetic(opts.source, work / "synthetic", log=log)
    return source_path, f"synthetic checkpoint built from {opts.source}"


def _audit(source: Checkpoint) -> tuple[CheckResult, ...]:
    """Stage 0: the source's own checks, then (where they pass) megatron-core's model of it."""
    from mtpcheck.convert import builtin

    # first: a damaged source is a finding, whatever its family
    audit = source_checks(source)
    if not any(c.status is Status.FAIL for c in audit):
        builtin.require_hf(source)
        builtin.require_unquantized(source)  # exit 2, before megatron-core's model of it
        audit = (*audit, source_check(mcore_model_check(source)))
    return audit


@dataclass(frozen=True)
class _Converting:
    """What both conversion stages work from."""

    opts: RoundtripOptions
    source: Checkpoint
    """The source checkpoint, opened (headers only)."""
    log: Callable[[str], None]
    clock: StageClock | None


def _stage1(
    converting: _Converting, source_path: Path, megatron_dir: Path
) -> tuple[StageRun, Checkpoint | None]:
    """HF -> Megatron from ``source_path`` into ``megatron_dir`` (the user's converter or the
    built-in one), and its output opened where the stage left it readable."""
    from mtpcheck.convert import builtin

    opts, source, log = converting.opts, converting.source, converting.log
    clock = converting.clock

    if not opts.to_megatron:
        with _timed(clock, "stage1-import"):  # megatron-core's writer, apart from the writing
            import mtpcheck.convert.torch_dist_writer  # noqa: F401
    log(f"{STAGE1}: converting into {megatron_dir}")
    with _timed_stage(clock, "stage1-convert", megatron_dir):
        if opts.to_megatron:
            result = _user_converter(opts.to_megatron, source_path, megatron_dir, opts, log, 1)
        else:
            # intermediates are read back and deleted: no fsync (like cp, they may never hit
            # disk)
            result = _builtin(
                lambda: builtin.hf_to_megatron(
                    source, megatron_dir, durable=False, log=log, writer_threads=WRITER_THREADS
                ),
                megatron_dir,
            )
    with _timed(clock, "stage1-open"):
        megatron, unreadable = (
            try_open(megatron_dir, opts.trust_pickle) if result.ok else (None, None)
        )
    return StageRun(result, megatron_dir, unreadable), megatron


def _stage2(
    converting: _Converting, megatron_dir: Path, megatron: Checkpoint, final_dir: Path
) -> tuple[StageRun, Checkpoint | None]:
    """Megatron -> HF from stage 1's ``megatron_dir`` into ``final_dir``, and its output
    opened where the stage left it readable."""
    from mtpcheck.convert import builtin
    from mtpcheck.mapping import as_megatron

    opts, source, log = converting.opts, converting.source, converting.log
    clock = converting.clock
    log(f"{STAGE2}: converting into {final_dir}")
    with _timed_stage(clock, "stage2-convert", final_dir):
        if opts.to_hf:
            result = _user_converter(opts.to_hf, megatron_dir, final_dir, opts, log, 2)
        else:
            # the copies the source stores, and no others (a release may store some, not all)
            copies = frozenset(c for c, _ in as_megatron(source).plan.copies if c in source.tensors)
            result = _builtin(
                lambda: builtin.megatron_to_hf(
                    megatron, final_dir, dict(source.config), copies, durable=False, log=log
                ),
                final_dir,
            )
    with _timed(clock, "stage2-open"):
        final, unreadable = try_open(final_dir, opts.trust_pickle) if result.ok else (None, None)
    return StageRun(result, final_dir, unreadable), final


def _require_mapping(source: Checkpoint, shown: Path) -> None:
    """Refuse a source whose Megatron checkpoint mtpcheck could not judge, before a converter
    runs (hours on a real model) rather than after both."""
    from mtpcheck.mapping import MappingError, as_megatron

    try:
        as_megatron(source)
    except MappingError as e:
        raise _unjudged(e, source.path, shown, detect_family(source.config)) from e


def _unjudged(e: Exception, where: str | Path, shown: Path, family: MtpFamily | None) -> InputError:
    """The refusal of a source with no HF <-> Megatron mapping: what converts it elsewhere,
    and how to compare the ends of a round trip through it."""
    from mtpcheck.mapping import mapped_families

    others = "; ".join(c.words() for c in family.support.elsewhere) if family else ""
    return InputError(
        where,
        f"{e}: roundtrip cannot judge the Megatron checkpoint between its stages, so no "
        f"converter was run; {others + ': ' if others else ''}`mtpcheck diff {shown} FINAL_HF` "
        f"compares the two HF ends (families with a mapping: "
        f"{mapped_families()})",
    )


def open_outputs(conversions: Conversions, trust_pickle: bool) -> Opened:
    """Open (headers only) the source and every output its stage left readable."""

    def output(run: StageRun | None) -> Checkpoint | None:
        return open_checkpoint(run.output, trust_pickle) if run and run.readable else None

    source = open_checkpoint(conversions.source)
    return Opened(source, output(conversions.stage1), output(conversions.stage2))


def _stage_checks(run: StageRun, name: CheckName, title: str, stage: str) -> list[CheckResult]:
    checks = [stage_check(name, title, run.result, stage)]
    if run.result.ok and run.unreadable is not None:
        checks.append(unreadable_check(stage, run.unreadable))
    return checks


def _not_converted(audit: tuple[CheckResult, ...]) -> CheckResult:
    """Stage 1 skipped: the source fails its audit (the checks that fail are named)."""
    failed = ", ".join(c.label for c in audit if c.status is Status.FAIL)
    why = (
        f"not run: the source fails its audit ({failed}); a conversion would carry its defects "
        "through both stages and blame them on the converter"
    )
    return CheckResult(
        CheckName.STAGE1_CONVERT, "Stage 1: converter", (Finding(STAGE1, Status.SKIP, why),)
    )


def check(
    conversions: Conversions,
    opened: Opened,
    all_tensors: bool,
    compare: Compare = compare_many,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> Report:
    """The report on the converted checkpoints; ``compare`` compares the tensors of each stage
    (one call per stage)."""
    checks = list(conversions.source_audit)
    inputs = [summary_of(opened.source)]
    if conversions.label is not None:
        inputs[0] = replace(inputs[0], path=conversions.label)
    if conversions.stage1 is None:
        checks.append(_not_converted(conversions.source_audit))
        return Report("roundtrip", tuple(inputs), tuple(checks))
    checks += _stage_checks(
        conversions.stage1, CheckName.STAGE1_CONVERT, "Stage 1: converter", STAGE1
    )
    if opened.megatron is None or conversions.stage2 is None:
        return Report("roundtrip", tuple(inputs), tuple(checks))
    inputs.append(summary_of(opened.megatron))
    first, stage1_results, expected = stage1_checks(opened.source, opened.megatron, compare, layout)
    checks += first
    checks += _stage_checks(
        conversions.stage2, CheckName.STAGE2_CONVERT, "Stage 2: converter", STAGE2
    )
    if opened.final is None:
        return Report("roundtrip", tuple(inputs), tuple(checks))
    inputs.append(summary_of(opened.final))
    second, comparisons = stage2_checks(
        opened.source, opened.final, stage1_results, expected, all_tensors, compare
    )
    checks += (*second, final_main_model_check(opened.final), final_count_check(opened.final))
    return Report("roundtrip", tuple(inputs), tuple(checks), comparisons)
