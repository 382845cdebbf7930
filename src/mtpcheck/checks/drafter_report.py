"""The audit of a drafter that ships beside its target (``inspect DRAFTER [--target TARGET]``)
and the comparison of an MTP layer taken out of a target with the target's own (``diff
TARGET DRAFTER``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from mtpcheck.checks.drafter_checks import kind_check, taps_check, tensors_check
from mtpcheck.checks.drafter_mtp import mtp_extract_check
from mtpcheck.checks.drafter_pairing import (
    Target,
    embedding_check,
    positions_check,
    shape_check,
    target_of,
    verifier_check,
)
from mtpcheck.checks.drafter_serving import serving_settings
from mtpcheck.checks.drafter_vocab import vocab_check
from mtpcheck.checks.findings import integrity_check
from mtpcheck.families import MtpAnalysis, analyse, summarise
from mtpcheck.families.drafter_kinds import FROZEN_EMBEDDING, DrafterKind, Shared
from mtpcheck.families.drafters import DrafterConfig, read_config, recognise
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckpointSummary,
    CheckResult,
    Finding,
    Report,
    Status,
    TensorComparison,
)
from mtpcheck.model.config_keys import lookup

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]


def drafter_summary(ckpt: Checkpoint, kind: DrafterKind) -> CheckpointSummary:
    """What a report says of a drafter input: its kind where a family would be."""
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    summary = replace(summarise(ckpt, analysis), family_display=f"drafter: {kind.display}")
    if summary.num_hidden_layers is None:  # a drafter format keeps its own count elsewhere
        summary = replace(summary, num_hidden_layers=read_config(kind, ckpt.config).layers)
    if kind.mtp_extract or summary.declared_mtp:
        return summary
    return replace(summary, declared_by="a drafter beside its target, not MTP layers")


def _frozen(ckpt: Checkpoint) -> bool:
    """Whether the drafter's config says its embedding is the target's, kept frozen."""
    return any(lookup(ckpt.config, key) is value for key, value in FROZEN_EMBEDDING)


def _needs_target(kind: DrafterKind) -> CheckResult:
    what = (
        "the MTP layer against the target's, bit for bit"
        if kind.mtp_extract
        else "vocabulary, widths, taps, embedding and head against the target"
    )
    return CheckResult(
        CheckName.PAIRING,
        "Drafter and target",
        (Finding("target", Status.SKIP, f"not checked without --target TARGET: {what}"),),
    )


def _pairing(
    drafter: Checkpoint,
    kind: DrafterKind,
    cfg: DrafterConfig,
    target: Target,
    analysis: MtpAnalysis,
    compare: Compare,
    tokenizers: tuple[str | None, str | None],
) -> tuple[list[CheckResult], tuple[TensorComparison, ...]]:
    """The drafter against ``target`` (``analysis``: its MTP layers), and the tensor
    comparisons made."""
    if kind.mtp_extract:
        check, comparisons = mtp_extract_check(drafter, kind, target.ckpt, analysis, compare)
        return [check], comparisons
    checks = [shape_check(kind, cfg, target, tokenizers)]
    holds = {"embed_tokens.weight", "lm_head.weight"} & set(drafter.tensors)
    if kind.shared is Shared.OWN_OR_TARGET or (kind.shared is Shared.TARGET and holds):
        checks.append(embedding_check(drafter, kind, cfg, target, compare, _frozen(drafter)))
    checks += [c for c in (verifier_check(cfg, target), positions_check(cfg, target)) if c]
    return checks, ()


def drafter_report(
    drafter: Checkpoint,
    kind: DrafterKind,
    compare: Compare,
    target: Checkpoint | None = None,
    family_checks: Sequence[CheckResult] = (),
    tokenizers: tuple[str | None, str | None] = (None, None),
) -> Report:
    """The inspect report of ``drafter``, against ``target`` where given. ``family_checks``:
    the MTP family's own checks, for a drafter that is also a family (Gemma-4 assistant).
    ``tokenizers``: digests of the two sides' token tables, where each ships one."""
    cfg = read_config(kind, drafter.config)
    pairs = [("", drafter)] if target is None else [("drafter", drafter), ("target", target)]
    checks = [integrity_check(pairs), *family_checks, kind_check(kind, cfg)]
    checks.append(tensors_check(kind, cfg, drafter.tensors, drafter.config))
    comparisons: tuple[TensorComparison, ...] = ()
    inputs = [drafter_summary(drafter, kind)]
    if target is None:
        checks += [c for c in (taps_check(kind, cfg), vocab_check(drafter, kind, cfg)) if c]
        checks.append(_needs_target(kind))
    else:
        analysis = analyse(target.config, target.tensors, target.config_path)
        facts = target_of(target, analysis)
        checks += [
            c for c in (taps_check(kind, cfg, facts.layers), vocab_check(drafter, kind, cfg)) if c
        ]
        paired, comparisons = _pairing(drafter, kind, cfg, facts, analysis, compare, tokenizers)
        checks += paired
        inputs.append(summarise(target, analysis))
    checks.append(serving_settings(kind, drafter.config, drafter.path))
    return Report("inspect", tuple(inputs), tuple(checks), tensors=comparisons)


def extraction_diff(a: Checkpoint, b: Checkpoint, compare: Compare) -> Report | None:
    """``diff`` of a target with an MTP layer taken out of it (either order): the drafter's
    tensors against the target's MTP layer, with an extraction's scope; None when neither
    side is such a drafter."""
    kind_a, kind_b = (recognise(c.config, c.tensors) for c in (a, b))
    if kind_b is not None and kind_b.mtp_extract and not (kind_a and kind_a.mtp_extract):
        target, drafter, kind = a, b, kind_b
    elif kind_a is not None and kind_a.mtp_extract and not (kind_b and kind_b.mtp_extract):
        target, drafter, kind = b, a, kind_a
    else:
        return None
    analysis = analyse(target.config, target.tensors, target.config_path)
    check, comparisons = mtp_extract_check(drafter, kind, target, analysis, compare)
    inputs = (
        summarise(a, analysis) if a is target else drafter_summary(a, kind),
        summarise(b, analysis) if b is target else drafter_summary(b, kind),
    )
    scope = CheckResult(
        CheckName.SCOPE,
        "What is compared",
        (
            Finding(
                "extraction",
                Status.INFO,
                f"{drafter.path} is {kind.display}: its tensors are compared with the "
                f"target's MTP layer; the main model's absence and the layer count are its "
                "scope, not findings",
            ),
        ),
    )
    checks = (integrity_check([("A", a), ("B", b)]), scope, check)
    return Report("diff", inputs, checks, tensors=comparisons)
