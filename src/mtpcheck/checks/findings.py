"""Turn tensor comparisons and reader issues into findings."""

from __future__ import annotations

from pathlib import Path

from mtpcheck.dtypes import exact_wider
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    Status,
    TensorComparison,
    TensorStatus,
    files_of,
)


def _fmt(dtype: str | None, shape: tuple[int, ...] | None) -> str:
    return f"{dtype}{list(shape) if shape is not None else ''}"


def _numel(shape: tuple[int, ...] | None) -> int:
    numel = 1
    for d in shape or ():
        numel *= d
    return numel


def describe(c: TensorComparison, left: str = "A", right: str = "B") -> str:
    """One sentence about one comparison."""
    if c.status is TensorStatus.EQUAL:
        return f"bit-identical ({c.nbytes} bytes)"
    if c.status is TensorStatus.MISSING:
        return f"missing in {right} (was {_fmt(c.dtype[0], c.shape[0])})"
    if c.status is TensorStatus.EXTRA:
        return f"only in {right} ({_fmt(c.dtype[1], c.shape[1])}), absent in {left}"
    if c.status is TensorStatus.DTYPE_CHANGED:
        changed = f"dtype changed {c.dtype[0]} -> {c.dtype[1]}"
        if c.values_differing == 0 and c.dtype[1] in exact_wider(c.dtype[0] or ""):
            return f"{changed} (every value kept: the wider type holds each exactly)"
        if c.values_differing == 0:
            return f"{changed} (every value kept: each is exactly a value of {c.dtype[1]})"
        if c.values_differing is not None:
            return f"{changed}; {c.values_differing} of {_numel(c.shape[0])} values differ"
        return changed
    if c.status is TensorStatus.SHAPE_CHANGED:
        return f"shape changed {list(c.shape[0] or ())} -> {list(c.shape[1] or ())}"
    if c.status is TensorStatus.UNREADABLE:
        return "bytes unreadable (file truncated)"
    if c.status is TensorStatus.QUANTIZED:
        was, now = c.storage or ("?", "?")
        if c.steps is not None:
            return (
                f"stored {was} in {left}, {now} in {right}; dequantized, within "
                f"{c.steps:.3f} steps of {left}"
            )
        return f"stored {was} in {left}, {now} in {right} (not comparable bit for bit)"
    if c.status is TensorStatus.NOT_COMPARED:
        return (
            f"same dtype and shape; bytes not compared ({c.nbytes} bytes on each side, "
            "--fetch compares them by range reads)"
        )
    numel = _numel(c.shape[0])
    context = f"; max abs diff {c.max_abs_diff:.6g}" if c.max_abs_diff is not None else ""
    return (
        f"bits differ in {c.differing_elements} of {numel} elements, "
        f"first at index {list(c.first_difference or ())}{context}"
    )


def status_of(c: TensorComparison) -> Status:
    """The verdict on one comparison: equal PASS, not compared SKIP, compared in quantization
    steps INFO, widened to a float type that holds every value exactly WARN (not the same
    bytes, but no value lost: one rule for diff and roundtrip), anything else FAIL."""
    if c.status is TensorStatus.EQUAL:
        return Status.PASS
    if c.status is TensorStatus.NOT_COMPARED:
        return Status.SKIP
    if c.status is TensorStatus.QUANTIZED:
        return Status.INFO
    if c.status is TensorStatus.DTYPE_CHANGED and c.values_differing == 0:
        return Status.WARN
    return Status.FAIL


def comparison_finding(c: TensorComparison, left: str = "A", right: str = "B") -> Finding:
    """One tensor's comparison as a finding (:func:`status_of`); ``left`` / ``right`` name
    the two sides."""
    status = status_of(c)
    return Finding(
        subject=c.name,
        status=status,
        message=describe(c, left, right),
        details={"status": c.status.value},
    )


def first_failure(checks: tuple[CheckResult, ...]) -> tuple[CheckResult, Finding] | None:
    """The first failing finding of ``checks``, in report order, with its check."""
    for check in checks:
        for finding in check.findings:
            if finding.status is Status.FAIL:
                return check, finding
    return None


def failing_count(checks: tuple[CheckResult, ...]) -> int:
    """How many findings of ``checks`` fail."""
    return sum(1 for check in checks for f in check.findings if f.status is Status.FAIL)


def integrity_check(checkpoints: list[tuple[str, Checkpoint]]) -> CheckResult:
    """Reader-reported structural problems, one FAIL each; PASS when there are none."""
    findings: list[Finding] = []
    for label, ckpt in checkpoints:
        prefix = f"{label}: " if label else ""
        findings.extend(
            Finding(prefix + issue.subject, Status.FAIL, issue.message, {"kind": issue.kind})
            for issue in ckpt.issues
        )
        if not ckpt.issues:
            files = files_of(ckpt.tensors)
            findings.append(
                Finding(
                    prefix + Path(ckpt.path).name,
                    Status.PASS,
                    f"{len(ckpt.tensors)} tensors in {len(files)} file(s); "
                    f"{ckpt.cross_checked} consistent",
                )
            )
    return CheckResult(CheckName.INTEGRITY, "Files, headers and index", tuple(findings))
