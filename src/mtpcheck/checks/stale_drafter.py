"""A drafter kept beside main weights that moved: the MTP layer bit-identical on both sides of a
diff while the last main layer, whose hidden state it drafts from, changed.

Such a checkpoint is complete and its MTP layer intact, so no other check objects; but the
drafter was trained on hidden states the new main model no longer produces, and its acceptance
falls. It is what mergekit's ``fill_missing_params`` writes (the base's MTP layer restored
beside a merge) and what a fine-tune that copies the MTP layer back from the base ships. The
comparison reads the last main layer outside its routed experts, a bounded share of one layer.

Across formats (HF against Megatron or GGUF) the two sides are compared in one's names, and B
may instead be A's conversion: then a moved main layer is the conversion's loss, and the
finding says both readings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mtpcheck.checks.findings import status_of
from mtpcheck.checks.main_layers import is_routed_expert
from mtpcheck.families import MtpAnalysis
from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.model import Checkpoint, Finding, Status, TensorComparison, TensorStatus

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]


def _last_main_layer(analysis: MtpAnalysis) -> str | None:
    family, hidden = analysis.family, analysis.num_hidden_layers
    if family is None or not hidden or not analysis.layers:
        return None
    return NameTemplate(family.layout.main_layer_prefix).main_layer(hidden - 1)


_KEPT = (
    "a drafter kept from the base (a merge's fill_missing_params, a fine-tune that copies the "
    "MTP layer back) drafts from hidden states this model no longer produces; measure what it "
    "still earns with `mtpcheck accept`"
)
_KEPT_OR_CONVERTED = (
    "if B is A converted, the conversion changed the main model (`diff --all` names every "
    "tensor); if B was trained or merged from A, its drafter was kept from the base and drafts "
    "from hidden states this model no longer produces (`mtpcheck accept` measures what it "
    "still earns)"
)
"""Across formats B may be A's conversion, which must not move the main model at all."""


def stale_drafter(
    a: Checkpoint,
    b: Checkpoint,
    analysis: MtpAnalysis,
    comparisons: Sequence[TensorComparison],
    compare: Compare,
    crossed: bool = False,
) -> Finding | None:
    """A WARN when every MTP tensor of ``a`` compared bit-identical in ``b`` while the last main
    layer's tensors (outside its routed experts) differ; None otherwise. ``crossed``: the two
    were stored in different formats and are compared in one's names."""
    prefix = _last_main_layer(analysis)
    by_name = {c.name: c for c in comparisons}
    mtp = [by_name.get(n) for n in sorted(analysis.mtp_names)]
    if (
        prefix is None
        or not mtp
        or any(c is None or c.status is not TensorStatus.EQUAL for c in mtp)
    ):
        return None
    names = sorted(
        n  # routed experts left out: the bulk of an MoE layer, and a merge moves the rest too
        for n in a.tensors
        if n.startswith(prefix) and not is_routed_expert(n) and n in b.tensors
    )
    pending = [(n, n) for n in names if n not in by_name]
    fresh = list(compare(a, b, pending)) if pending else []  # under --all: compared already
    main = [by_name[n] for n in names if n in by_name] + fresh
    moved = sorted(c.name for c in main if status_of(c) is Status.FAIL)
    if not moved:
        return None
    return Finding(
        "mtp layers",
        Status.WARN,
        f"bit-identical to A while the last main layer moved ({prefix}*: {len(moved)} of "
        f"{len(main)} tensors outside its routed experts differ): "
        + (_KEPT_OR_CONVERTED if crossed else _KEPT),
        {"moved": moved},
    )
