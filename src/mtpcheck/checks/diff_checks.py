"""Compare two checkpoints: configs, then tensors in the MTP scope (or all tensors)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from mtpcheck.checks.config_diff import config_check
from mtpcheck.checks.findings import comparison_finding, describe, integrity_check
from mtpcheck.checks.main_model_checks import sides_check
from mtpcheck.checks.quant_pairs import QuantizedPair, quantized_pairs
from mtpcheck.checks.tensor_match import compare_many
from mtpcheck.errors import InputError
from mtpcheck.families import analyse, summarise
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import (
    Checkpoint,
    CheckResult,
    Finding,
    Naming,
    Report,
    Status,
    TensorComparison,
    TensorStatus,
)
from mtpcheck.params import Scheme, declared_scheme

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]


GGUF_COUNT_KEYS = ("nextn_predict_layers", "num_hidden_layers")
"""What a diff of an HF checkpoint and a GGUF file compares of their configs."""

STEPS_ALLOWED = 1.0
"""Round to nearest puts every value within half a step; one step leaves room for a scale
rounded on its own (FP8 scales) without passing data that is not the original's."""


def _dequantized(
    pair: QuantizedPair, a: Checkpoint, b: Checkpoint, scheme_a: Scheme, scheme_b: Scheme
) -> tuple[Finding, TensorComparison]:
    """The finding of one quantized parameter, dequantized and measured against the side
    that holds it in full precision."""
    from mtpcheck.checks.dequantize import (  # numpy: only here
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
    except NotDequantized as e:
        return Finding(c.name, Status.INFO, f"{describe(c)}; not dequantized: {e}"), c
    measured = replace(c, steps=steps)
    if steps <= STEPS_ALLOWED:
        return Finding(c.name, Status.PASS, describe(measured), {"steps": steps}), measured
    finding = Finding(
        c.name,
        Status.FAIL,
        f"{describe(measured)}: the quantized values are not the full-precision ones",
        {"steps": steps},
    )
    return finding, measured


def _is_megatron(ckpt: Checkpoint) -> bool:
    return ckpt.naming is Naming.MEGATRON


def align_formats(
    a: Checkpoint, b: Checkpoint, layout: MegatronLayout = MegatronLayout.MEGATRON_CORE
) -> tuple[Checkpoint, Checkpoint, bool, tuple[str, ...]]:
    """Across formats, show the HF side under Megatron names (bit-exact mapping); also the
    names, on either side, that the mapping does not cover (a vision tower), which are not
    compared."""
    if Naming.GGUF in (a.naming, b.naming) and a.naming is not b.naming:
        from mtpcheck.checks.gguf_diff import align_gguf  # numpy: only here

        return align_gguf(a, b)
    if _is_megatron(a) == _is_megatron(b):
        return a, b, False, ()
    from mtpcheck.mapping import (  # numpy: only here
        MappingError,
        as_megatron,
        build_plan,
        mapped_families,
    )

    hf, megatron = (b, a) if _is_megatron(a) else (a, b)
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
    return ((view, b) if hf is a else (a, view)) + (True, outside)


def _outside_finding(outside: Sequence[str], other: str) -> Finding:
    few = ", ".join(outside[:3]) + (", ..." if len(outside) > 3 else "")
    return Finding(
        "outside the mapping",
        Status.SKIP,
        f"{len(outside)} tensor(s) no HF <-> {other} rule covers, not compared ({few})",
        {"names": list(outside)},
    )


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
    a, b, crossed, outside = align_formats(a, b, layout)
    analysis_a = analyse(a.config, a.tensors, a.config_path)
    analysis_b = analyse(b.config, b.tensors, b.config_path)
    if all_tensors:
        names = (set(a.tensors) | set(b.tensors)) - set(outside)
        scope = "all tensors"
    else:
        names = set(analysis_a.scope(a.tensors)) | set(analysis_b.scope(b.tensors))
        scope = "MTP scope"
    gguf = Naming.GGUF in (a.naming, b.naming)
    if crossed and gguf:
        from mtpcheck.checks.gguf_diff import lossy_findings

        measured, covered = lossy_findings(a, b, names, dequantize, STEPS_ALLOWED)
    else:
        scheme_a, scheme_b = declared_scheme(a), declared_scheme(b)
        found, covered = quantized_pairs(a.tensors, b.tensors, names, scheme_a, scheme_b)
        measured = [
            _dequantized(p, a, b, scheme_a, scheme_b)
            if dequantize
            else (comparison_finding(p.comparison), p.comparison)
            for p in found
        ]
    notes = [finding for finding, _ in measured]
    quantized = [c for _, c in measured]
    pairs = [(n, n) for n in sorted(names - covered)]
    comparisons = (*compare(a, b, pairs), *quantized)
    comparisons = tuple(sorted(comparisons, key=lambda c: c.name))
    failing = [
        comparison_finding(c)
        for c in comparisons
        if c.status not in (TensorStatus.EQUAL, TensorStatus.QUANTIZED)
    ]
    equal = [c for c in comparisons if c.status is TensorStatus.EQUAL]
    also = f"; {len(quantized)} stored quantized differently" if quantized else ""
    summary = Finding(
        scope,
        Status.PASS if not failing else Status.INFO,
        f"{len(equal)} of {len(comparisons)} tensors bit-identical "
        f"({sum(c.nbytes for c in equal)} bytes compared equal){also}",
        {"tensors": len(comparisons), "equal": len(equal), "quantized": len(quantized)},
    )
    if not comparisons:
        summary = Finding(scope, Status.SKIP, "no tensors in scope on either side")
    if crossed:
        keys = GGUF_COUNT_KEYS if gguf else ("mtp_num_layers", "num_layers")
        config = config_check(
            {k: a.config.get(k) for k in keys}, {k: b.config.get(k) for k in keys}, True, True
        )
    else:
        config = config_check(
            a.config, b.config, a.config_path is not None, b.config_path is not None
        )
    other = "GGUF" if gguf else "Megatron"
    notes_gguf: tuple[Finding, ...] = ()
    if crossed and gguf:
        from mtpcheck.checks.gguf_diff import converter_notes

        notes_gguf = converter_notes(a, b)
    unmapped = (_outside_finding(outside, other),) if outside and all_tensors else ()
    checks = (
        integrity_check([("A", a), ("B", b)]),
        sides_check([("A", a, analysis_a), ("B", b, analysis_b)]),
        config,
        CheckResult(
            "tensors",
            f"Tensor matcher ({scope})",
            (summary, *notes_gguf, *unmapped, *failing, *notes),
        ),
    )
    return Report(
        command="diff",
        inputs=(summarise(a, analysis_a), summarise(b, analysis_b)),
        checks=checks,
        tensors=comparisons,
    )
