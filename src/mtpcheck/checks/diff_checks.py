"""Compare two checkpoints: configs, then tensors in the MTP scope (or all tensors)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mtpcheck.checks.config_diff import config_check
from mtpcheck.checks.findings import comparison_finding, integrity_check
from mtpcheck.checks.tensor_match import compare_many
from mtpcheck.families import analyse, summarise
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

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]


def _is_megatron(ckpt: Checkpoint) -> bool:
    return ckpt.naming is Naming.MEGATRON


def align_formats(a: Checkpoint, b: Checkpoint) -> tuple[Checkpoint, Checkpoint, bool]:
    """Across formats, show the HF side under Megatron names (bit-exact mapping)."""
    if _is_megatron(a) == _is_megatron(b):
        return a, b, False
    from mtpcheck.mapping import as_megatron  # numpy: only on the cross-format path

    if _is_megatron(b):
        return as_megatron(a), b, True
    return a, as_megatron(b), True


def diff_report(
    a: Checkpoint, b: Checkpoint, all_tensors: bool = False, compare: Compare = compare_many
) -> Report:
    """Build the diff report of ``b`` against ``a``.

    ``compare`` compares ``(a_name, b_name)`` pairs in order (the tensor matcher, or its
    sharded form under torchrun: ``mtpcheck.pipeline.distributed``).
    """
    a, b, crossed = align_formats(a, b)
    analysis_a = analyse(a.config, a.tensors, a.config_path)
    analysis_b = analyse(b.config, b.tensors, b.config_path)
    if all_tensors:
        names = set(a.tensors) | set(b.tensors)
        scope = "all tensors"
    else:
        names = set(analysis_a.scope(a.tensors)) | set(analysis_b.scope(b.tensors))
        scope = "MTP scope"
    comparisons = tuple(compare(a, b, [(n, n) for n in sorted(names)]))
    failing = [comparison_finding(c) for c in comparisons if c.status is not TensorStatus.EQUAL]
    equal = [c for c in comparisons if c.status is TensorStatus.EQUAL]
    summary = Finding(
        scope,
        Status.PASS if not failing else Status.INFO,
        f"{len(equal)} of {len(comparisons)} tensors bit-identical "
        f"({sum(c.nbytes for c in equal)} bytes compared equal)",
        {"tensors": len(comparisons), "equal": len(equal)},
    )
    if not comparisons:
        summary = Finding(scope, Status.SKIP, "no tensors in scope on either side")
    if crossed:
        keys = ("mtp_num_layers", "num_layers")
        config = config_check(
            {k: a.config.get(k) for k in keys}, {k: b.config.get(k) for k in keys}, True, True
        )
    else:
        config = config_check(
            a.config, b.config, a.config_path is not None, b.config_path is not None
        )
    checks = (
        integrity_check([("A", a), ("B", b)]),
        config,
        CheckResult("tensors", f"Tensor matcher ({scope})", (summary, *failing)),
    )
    return Report(
        command="diff",
        inputs=(summarise(a, analysis_a), summarise(b, analysis_b)),
        checks=checks,
        tensors=comparisons,
    )
