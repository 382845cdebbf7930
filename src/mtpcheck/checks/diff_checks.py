"""Compare two checkpoints: configs, then tensors in the MTP scope (or all tensors)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from mtpcheck.checks.config_diff import config_check
from mtpcheck.checks.findings import comparison_finding, describe, integrity_check
from mtpcheck.checks.main_model_checks import sides_check
from mtpcheck.checks.quant_pairs import QuantizedPair, quantized_pairs
from mtpcheck.checks.stacked_experts import has_stacked, unstacked
from mtpcheck.checks.stale_drafter import stale_drafter
from mtpcheck.checks.tensor_match import Compare, compare_many
from mtpcheck.errors import InputError
from mtpcheck.families import MtpAnalysis, analyse, summarise
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    Naming,
    Report,
    Status,
    TensorComparison,
    TensorStatus,
)
from mtpcheck.params import Rounding, Scheme, declared_scheme
from mtpcheck.units import first_few

Measured = tuple[list[tuple[Finding, TensorComparison]], set[str]]
"""The parameters stored differently on the two sides, each with its finding, and every
tensor name they cover (which the tensor matcher then leaves alone)."""


GGUF_COUNT_KEYS = ("nextn_predict_layers", "num_hidden_layers")
"""What a diff of an HF checkpoint and a GGUF file compares of their configs."""
MEGATRON_COUNT_KEYS = ("mtp_num_layers", "num_layers")
"""What a diff of an HF checkpoint and a Megatron one compares of their configs."""

STEPS_ALLOWED = 1.0
"""Round to nearest puts every value within half a step; one step leaves room for a scale
rounded on its own (FP8 scales) without passing data that is not the original's."""


def _dequantized(
    pair: QuantizedPair, a: Checkpoint, b: Checkpoint, scheme_a: Scheme, scheme_b: Scheme
) -> tuple[Finding, TensorComparison]:
    """The finding of one quantized parameter, dequantized and measured against the side
    that holds it in full precision."""
    from mtpcheck.checks.dequantize import (  # numpy: only here
        Malformed,
        NotDequantized,
        full_precision,
        steps_off,
    )

    c = pair.comparison
    try:
        if pair.slices:  # B's per-expert parameters, each rows of A's fused tensor
            fused = full_precision(a, pair.a)
            steps = max(
                steps_off(fused[e, start:stop], b, param, scheme_b)
                for param, e, start, stop in pair.slices
            )
        elif pair.b.quantized(b.tensors):
            steps = steps_off(full_precision(a, pair.a), b, pair.b, scheme_b)
        else:
            steps = steps_off(full_precision(b, pair.b), a, pair.a, scheme_a)
    except Malformed as e:
        return Finding(c.name, Status.FAIL, f"{describe(c)}; cannot be decoded: {e}"), c
    except NotDequantized as e:
        return Finding(c.name, Status.INFO, f"{describe(c)}; not dequantized: {e}"), c
    measured = replace(c, steps=steps)
    rounding = (scheme_b if pair.b.quantized(b.tensors) else scheme_a).rounding
    if rounding is not Rounding.NEAREST:
        why = f"{describe(measured)}; not judged by steps: {rounding.unjudged_because}"
        return Finding(c.name, Status.INFO, why, {"steps": steps}), measured
    if steps <= STEPS_ALLOWED:
        return Finding(c.name, Status.PASS, describe(measured), {"steps": steps}), measured
    finding = Finding(
        c.name,
        Status.FAIL,
        f"{describe(measured)}: the quantized values are not the full-precision ones",
        {"steps": steps},
    )
    return finding, measured


def _declared_pairs(a: Checkpoint, b: Checkpoint, names: set[str], dequantize: bool) -> Measured:
    """The parameters the two sides store in different forms of their declared quantization
    schemes, each dequantized and measured with ``dequantize``."""
    scheme_a, scheme_b = declared_scheme(a), declared_scheme(b)
    found, covered = quantized_pairs(a.tensors, b.tensors, names, scheme_a, scheme_b)
    measured = [
        _dequantized(p, a, b, scheme_a, scheme_b)
        if dequantize
        else (comparison_finding(p.comparison), p.comparison)
        for p in found
    ]
    return measured, covered


def _gguf_pairs(a: Checkpoint, b: Checkpoint, names: set[str], dequantize: bool) -> Measured:
    """HF against GGUF: the tensors the GGUF file holds in a type that loses values."""
    from mtpcheck.checks.gguf_diff import lossy_findings  # numpy: only here

    return lossy_findings(a, b, names, dequantize, STEPS_ALLOWED)


def _gguf_notes(a: Checkpoint, b: Checkpoint) -> tuple[Finding, ...]:
    """HF against GGUF: what llama.cpp's converter does."""
    from mtpcheck.checks.gguf_diff import converter_notes

    return converter_notes(a, b)


def _align_gguf(
    a: Checkpoint, b: Checkpoint, layout: MegatronLayout
) -> tuple[Checkpoint, Checkpoint, tuple[str, ...]]:
    """The HF side shown under the GGUF file's names."""
    from mtpcheck.checks.gguf_diff import align_gguf  # numpy: only here

    return align_gguf(a, b)


def _align_megatron(
    a: Checkpoint, b: Checkpoint, layout: MegatronLayout
) -> tuple[Checkpoint, Checkpoint, tuple[str, ...]]:
    """The HF side shown under canonical Megatron names, as ``layout`` lays it out."""
    from mtpcheck.mapping import (  # numpy: only here
        MappingError,
        as_megatron,
        build_plan,
        mapped_families,
    )

    hf, megatron = (b, a) if a.naming is Naming.MEGATRON else (a, b)
    try:
        view = as_megatron(hf, layout)
    except MappingError as e:
        raise InputError(
            hf.path,
            f"{e}: it cannot be compared with the Megatron checkpoint {megatron.path}; diff it "
            f"with an HF checkpoint instead (families with a mapping: {mapped_families()})",
        ) from e
    planned = build_plan(hf.config, megatron.tensors, "megatron", layout)
    outside = (*view.plan.unmapped, *planned.unmapped)
    return (view, b, outside) if hf is a else (a, view, outside)


def _no_notes(a: Checkpoint, b: Checkpoint) -> tuple[Finding, ...]:
    return ()


@dataclass(frozen=True)
class Crossing:
    """What a diff across naming schemes does, by the naming of the side that is not HF: how
    the HF side is shown under its names, which tensors it stores differently, what of the
    configs compares, what else it says."""

    word: str
    """The other side's format in words (``GGUF``)."""
    config_keys: tuple[str, ...]
    """The config keys both sides spell alike."""
    align: Callable[
        [Checkpoint, Checkpoint, MegatronLayout], tuple[Checkpoint, Checkpoint, tuple[str, ...]]
    ]
    """Both sides under one naming, and the names no rule covers (not compared)."""
    stored_differently: Callable[[Checkpoint, Checkpoint, set[str], bool], Measured]
    """The tensors the sides store in different forms, measured when asked (``dequantize``)."""
    notes: Callable[[Checkpoint, Checkpoint], tuple[Finding, ...]] = _no_notes
    """What else a diff across these formats says (the converter's choices)."""


CROSSINGS: Mapping[Naming, Crossing] = {
    Naming.GGUF: Crossing("GGUF", GGUF_COUNT_KEYS, _align_gguf, _gguf_pairs, _gguf_notes),
    Naming.MEGATRON: Crossing("Megatron", MEGATRON_COUNT_KEYS, _align_megatron, _declared_pairs),
}
"""Each naming an HF checkpoint is compared across, the first that either side uses winning
(a GGUF file beside a Megatron checkpoint: the GGUF rule, which refuses the pair)."""


@dataclass(frozen=True)
class Aligned:
    """Two checkpoints under one naming, ready for the tensor matcher."""

    a: Checkpoint
    b: Checkpoint
    crossing: Crossing | None = None
    """How the sides were brought under one naming; None when they already shared one."""
    outside: tuple[str, ...] = ()
    """Names, on either side, that the crossing does not cover (a vision tower)."""


def align_formats(
    a: Checkpoint, b: Checkpoint, layout: MegatronLayout = MegatronLayout.MEGATRON_CORE
) -> Aligned:
    """Across naming schemes, show the HF side under the other side's names (bit-exact
    mapping); also the names, on either side, that the mapping does not cover, which are not
    compared."""
    if a.naming is b.naming:
        return Aligned(a, b)
    crossing = next(c for n, c in CROSSINGS.items() if n in (a.naming, b.naming))
    left, right, outside = crossing.align(a, b, layout)
    return Aligned(left, right, crossing, outside)


def _outside_finding(outside: Sequence[str], other: str) -> Finding:
    few = first_few(outside, 3, counted=False)
    return Finding(
        "outside the mapping",
        Status.SKIP,
        f"{len(outside)} tensor(s) no HF <-> {other} rule covers, not compared ({few})",
        {"names": list(outside)},
    )


def _config(sides: Aligned) -> CheckResult:
    """The configs: across naming schemes only the keys both spell alike."""
    a, b = sides.a, sides.b
    if sides.crossing is not None:
        keys = sides.crossing.config_keys
        return config_check(
            {k: a.config.get(k) for k in keys}, {k: b.config.get(k) for k in keys}, True, True
        )
    return config_check(a.config, b.config, a.config_path is not None, b.config_path is not None)


def _scope(
    sides: Aligned, analyses: tuple[MtpAnalysis, MtpAnalysis], all_tensors: bool
) -> tuple[set[str], str]:
    """The names compared, and the scope in words."""
    a, b = sides.a, sides.b
    if all_tensors:
        return (set(a.tensors) | set(b.tensors)) - set(sides.outside), "all tensors"
    names = set(analyses[0].scope(a.tensors)) | set(analyses[1].scope(b.tensors))
    return names, "MTP scope"


def _summary(scope: str, comparisons: Sequence[TensorComparison], quantized: int) -> Finding:
    """How many tensors compared bit-identical (and how many are stored differently)."""
    if not comparisons:
        return Finding(scope, Status.SKIP, "no tensors in scope on either side")
    equal = [c for c in comparisons if c.status is TensorStatus.EQUAL]
    failing = any(c.status not in (TensorStatus.EQUAL, TensorStatus.QUANTIZED) for c in comparisons)
    also = f"; {quantized} stored quantized differently" if quantized else ""
    return Finding(
        scope,
        Status.PASS if not failing else Status.INFO,
        f"{len(equal)} of {len(comparisons)} tensors bit-identical "
        f"({sum(c.nbytes for c in equal)} bytes compared equal){also}",
        {"tensors": len(comparisons), "equal": len(equal), "quantized": quantized},
    )


def _tensor_check(
    sides: Aligned, scope: tuple[set[str], str], compare: Compare, dequantize: bool, every: bool
) -> tuple[CheckResult, tuple[TensorComparison, ...]]:
    """The tensor matcher over the names in ``scope``: pairs stored differently measured, the
    rest compared bit for bit; with ``every`` (``--all``), the names left uncompared too."""
    names, label = scope
    a, b, crossing = sides.a, sides.b, sides.crossing
    stored_differently = crossing.stored_differently if crossing else _declared_pairs
    measured, covered = stored_differently(a, b, names, dequantize)
    quantized = [c for _, c in measured]
    pairs = [(n, n) for n in sorted(names - covered)]
    comparisons = tuple(sorted((*compare(a, b, pairs), *quantized), key=lambda c: c.name))
    failing = [
        comparison_finding(c)
        for c in comparisons
        if c.status not in (TensorStatus.EQUAL, TensorStatus.QUANTIZED)
    ]
    notes = crossing.notes(a, b) if crossing else ()
    unmapped: tuple[Finding, ...] = ()
    if sides.outside and every and crossing is not None:
        unmapped = (_outside_finding(sides.outside, crossing.word),)
    findings = (
        _summary(label, comparisons, len(quantized)),
        *notes,
        *unmapped,
        *failing,
        *(finding for finding, _ in measured),
    )
    return CheckResult(CheckName.TENSORS, f"Tensor matcher ({label})", findings), comparisons


def diff_report(
    a: Checkpoint,
    b: Checkpoint,
    all_tensors: bool = False,
    compare: Compare = compare_many,
    dequantize: bool = False,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> Report:
    """Build the diff report of ``b`` against ``a``.

    ``compare`` compares ``(a_name, b_name)`` pairs in order (the tensor matcher, or its
    sharded form under torchrun: ``mtpcheck.pipeline.distributed``).
    """
    if has_stacked(a.tensors) != has_stacked(b.tensors):  # mlx-lm's experts against HF's
        a, b = unstacked(a), unstacked(b)
    sides = align_formats(a, b, layout)
    a, b = sides.a, sides.b
    analyses = (
        analyse(a.config, a.tensors, a.config_path),
        analyse(b.config, b.tensors, b.config_path),
    )
    scope = _scope(sides, analyses, all_tensors)
    tensors, comparisons = _tensor_check(sides, scope, compare, dequantize, all_tensors)
    crossed = sides.crossing is not None
    stale = stale_drafter(a, b, analyses[0], comparisons, compare, crossed)
    tensors = replace(tensors, findings=(*tensors.findings, stale)) if stale else tensors
    checks = (
        integrity_check([("A", a), ("B", b)]),
        sides_check([("A", a, analyses[0]), ("B", b, analyses[1])]),
        _config(sides),
        tensors,
    )
    return Report(
        command="diff",
        inputs=(summarise(a, analyses[0]), summarise(b, analyses[1])),
        checks=checks,
        tensors=comparisons,
    )
