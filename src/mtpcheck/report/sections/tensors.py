"""Tensor comparisons (``diff``, ``roundtrip``): in the JSON report only; the other formats
show what the checks found in them."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import Report, TensorComparison
from mtpcheck.report.json_values import pick
from mtpcheck.report.section import Section


def _tensor(c: TensorComparison) -> dict[str, Any]:
    row = {
        "name": c.name,
        "status": c.status.value,
        "dtype": list(c.dtype),
        "shape": [list(s) if s is not None else None for s in c.shape],
        **pick(c, "nbytes differing_elements"),
        "first_difference": list(c.first_difference) if c.first_difference else None,
        **pick(c, "max_abs_diff values_differing"),
    }
    if c.storage is not None:
        row["storage"] = list(c.storage)
        row["steps"] = c.steps
    return row


def _json(report: Report) -> dict[str, Any]:
    return {"tensors": [_tensor(c) for c in report.tensors]}


SECTION = Section("tensors", json=_json)
"""The tensor comparisons: JSON only."""
