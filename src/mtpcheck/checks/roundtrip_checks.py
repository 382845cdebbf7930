"""Checks of an HF -> Megatron -> HF round trip, naming the stage where MTP was lost.

Tensors are compared through ``compare`` (the tensor matcher, or its sharded form under
torchrun: ``mtpcheck.pipeline.distributed``), one call per stage.
"""

from __future__ import annotations

from collections.abc import Mapping

from mtpcheck.checks.config_diff import config_check
from mtpcheck.checks.findings import describe, status_of
from mtpcheck.checks.inspect_checks import count_check, inspect_report
from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.checks.tensor_match import Compare, compare_many
from mtpcheck.families import MtpAnalysis, analyse, summarise
from mtpcheck.layouts import MegatronLayout
from mtpcheck.mapping import MappedCheckpoint, TensorMapping, as_megatron
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckpointSummary,
    CheckResult,
    Finding,
    Status,
    TensorComparison,
    TensorStatus,
)

SCOPE_MEGATRON = (
    "Megatron names: q/k/v and gate/up fused, no copies of the embedding and head, "
    "which the MTP layer shares with the main model"
)
SCOPE_HF = "the MTP layers' tensors, their embedding/head copies included, and the main ones"
"""What the tensor counts of the round trip cover, said where they are reported."""
STAGE1 = "stage 1 (HF -> Megatron)"
STAGE2 = "stage 2 (Megatron -> HF)"


def summary_of(ckpt: Checkpoint) -> CheckpointSummary:
    """The report's one-line summary of a checkpoint: its family, count and layers found."""
    return summarise(ckpt, analyse(ckpt.config, ckpt.tensors, ckpt.config_path))


def source_checks(source: Checkpoint) -> tuple[CheckResult, ...]:
    """Stage 0: every ``inspect`` check on the source (integrity, family, count, layers,
    shapes, shared copies), named ``source-NAME`` (:meth:`CheckName.source`). A source that
    fails one is not converted: its defects would otherwise come out of both stages and be
    blamed on a converter, or a source that already lost its MTP layers would round-trip "bit
    for bit" with only the embedding and head in scope."""
    return tuple(source_check(c) for c in inspect_report(source).checks)


def source_check(check: CheckResult) -> CheckResult:
    """``check`` as one of the source stage's: ``source-*``, titled "Source: ..."."""
    return CheckResult(check.name.source(), f"Source: {check.title}", check.findings)


def final_main_model_check(final: Checkpoint) -> CheckResult:
    """The checkpoint a converter wrote back, held to its own config: an export that drops
    main layers or shards passes an MTP-scope comparison, so its main model is judged whole
    here whatever the scope."""
    check = main_model_check(final, analyse(final.config, final.tensors, final.config_path))
    return CheckResult(CheckName.FINAL_MAIN_MODEL, f"Final: {check.title}", check.findings)


def final_count_check(final: Checkpoint) -> CheckResult:
    """What a serving engine will see: the final config's count against the complete MTP
    layers the final checkpoint holds (a converter that drops MTP usually keeps the key)."""
    count = count_check(analyse(final.config, final.tensors, final.config_path))
    return CheckResult(
        CheckName.FINAL_MTP_COUNT, "Final: declared vs present MTP layers", count.findings
    )


def stage1_checks(
    source: Checkpoint,
    megatron: Checkpoint,
    compare: Compare = compare_many,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> tuple[tuple[CheckResult, ...], dict[str, TensorComparison], MappedCheckpoint]:
    """Compare the Megatron output with what a correct conversion of ``source`` holds, laid
    out as ``layout``'s modules lay it out."""
    expected = as_megatron(source, layout)
    want = analyse(expected.config, expected.tensors)
    got = analyse(megatron.config, megatron.tensors, megatron.config_path)
    d_want, d_got = want.declared.value, got.declared.value
    if d_got == d_want:
        count = Finding("mtp_num_layers", Status.PASS, f"declares {d_got}, as the source")
    elif d_got is None and got.complete_layers == d_want:
        count = Finding(
            "mtp_num_layers",
            Status.WARN,
            f"{STAGE1}: Megatron output records no MTP count ({got.declared.source}); it holds "
            f"{d_want} complete MTP layer(s), as the source declares",
        )
    elif d_got is None:
        count = Finding(
            "mtp_num_layers",
            Status.FAIL,
            f"{STAGE1}: Megatron output records no MTP count ({got.declared.source}) and holds "
            f"{got.complete_layers} complete MTP layer(s); the source declares {d_want}",
        )
    else:
        count = Finding(
            "mtp_num_layers",
            Status.FAIL,
            f"{STAGE1}: Megatron declares {d_got} ({got.declared.source}), the source {d_want}",
        )
    scope = sorted(want.scope(expected.tensors) | got.scope(megatron.tensors))
    results = dict(zip(scope, compare(expected, megatron, [(n, n) for n in scope]), strict=True))
    findings = [
        Finding(
            name,
            status_of(c),
            f"{STAGE1}: {describe(c, 'source', 'Megatron output')} "
            f"[from {expected.sources.get(name, 'nothing in the source')}]",
            {"status": c.status.value, "hf": expected.sources.get(name)},
        )
        for name, c in results.items()
        if c.status is not TensorStatus.EQUAL
    ]
    equal = sum(1 for c in results.values() if c.status is TensorStatus.EQUAL)
    head = Finding(
        "mtp scope",
        Status.PASS if not findings else Status.INFO,
        f"{equal} of {len(results)} MTP-scope tensors bit-identical to the mapped source "
        f"({SCOPE_MEGATRON})",
        {"bytes_compared": sum(c.nbytes for c in results.values())},
    )
    checks = (
        CheckResult(CheckName.STAGE1_MTP_COUNT, "Stage 1: declared MTP layers", (count,)),
        CheckResult(
            CheckName.STAGE1_TENSORS, "Stage 1: Megatron tensors vs source", (head, *findings)
        ),
    )
    return checks, results, expected


def _layers_dropped_at_stage1(
    analysis: MtpAnalysis,
    to_megatron: Mapping[str, TensorMapping],
    stage1: Mapping[str, TensorComparison],
) -> frozenset[str]:
    """Source tensors of MTP layers of which stage 1 wrote nothing at all.

    The Megatron format keeps no copy of the embedding and head per MTP layer, so a converter
    re-creates them on export; when the whole layer was already gone after stage 1, their
    absence in the final checkpoint is stage 1's doing too.
    """
    dropped: set[str] = set()
    for layer in analysis.layers:
        written = [
            stage1[m.megatron]
            for n in layer.present
            if (m := to_megatron.get(n)) is not None and m.megatron in stage1
        ]
        if written and all(c.status is TensorStatus.MISSING for c in written):
            dropped.update(layer.present)
    return frozenset(dropped)


def stage2_checks(
    source: Checkpoint,
    final: Checkpoint,
    stage1: dict[str, TensorComparison],
    expected: MappedCheckpoint,
    all_tensors: bool,
    compare: Compare = compare_many,
) -> tuple[tuple[CheckResult, ...], tuple[TensorComparison, ...]]:
    """Compare the final HF checkpoint with the source; blame each loss on a stage."""
    a = analyse(source.config, source.tensors, source.config_path)
    b = analyse(final.config, final.tensors, final.config_path)
    if all_tensors:
        names = set(source.tensors) | set(final.tensors)
    else:
        names = set(a.scope(source.tensors)) | set(b.scope(final.tensors))
    comparisons = tuple(compare(source, final, [(n, n) for n in sorted(names)]))
    to_megatron = expected.plan.by_hf()
    dropped = _layers_dropped_at_stage1(a, to_megatron, stage1)
    findings = []
    for c in comparisons:
        if c.status is TensorStatus.EQUAL:
            continue
        mapping = to_megatron.get(c.name)
        first = stage1.get(mapping.megatron) if mapping else None
        lost_early = (first is not None and first.status is not TensorStatus.EQUAL) or (
            mapping is None and c.name in dropped
        )
        stage = STAGE1 if lost_early else STAGE2
        via = f" (as {mapping.megatron})" if mapping else ""
        findings.append(
            Finding(
                c.name,
                status_of(c),
                f"{stage}{via}: {describe(c, 'source', 'final')}",
                {"status": c.status.value, "stage": 1 if lost_early else 2},
            )
        )
    equal = sum(1 for c in comparisons if c.status is TensorStatus.EQUAL)
    scope = "all tensors" if all_tensors else "MTP scope"
    head = Finding(
        scope,
        Status.PASS if not findings else Status.INFO,
        f"{equal} of {len(comparisons)} final tensors bit-identical to the source "
        f"({'every tensor' if all_tensors else SCOPE_HF})",
        {"bytes_compared": sum(c.nbytes for c in comparisons)},
    )
    config = config_check(
        source.config, final.config, source.config_path is not None, final.config_path is not None
    )
    checks = (
        CheckResult(CheckName.CONFIG, "Final config vs source", config.findings),
        CheckResult(
            CheckName.ROUNDTRIP_TENSORS, f"Final tensors vs source ({scope})", (head, *findings)
        ),
    )
    return checks, comparisons
