"""The inputs: what mtpcheck learned about each checkpoint it read."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import CheckpointSummary, MtpLayerReport, Report
from mtpcheck.report.blocks import BLANK, Block, Cell, Column, Grid
from mtpcheck.report.formatting import md_cell, md_table
from mtpcheck.report.json_values import pick
from mtpcheck.report.section import Section
from mtpcheck.units import human_size


def _incomplete(layer: MtpLayerReport) -> str:
    parts = [f"{len(layer.missing)} missing"] if layer.missing else []
    if layer.unreadable:
        parts.append(f"{len(layer.unreadable)} unreadable")
    return ", ".join(parts)


def _grid(s: CheckpointSummary, label: str) -> Grid:
    """One input as key / value lines under its path."""
    declared = "none" if s.declared_mtp is None else str(s.declared_mtp)
    hidden = str(s.num_hidden_layers) if s.num_hidden_layers is not None else "?"
    rows = [
        ("format", s.format),
        ("family", f"{s.family_display} (model_type {s.model_type or 'absent'})"),
        ("declared MTP layers", f"{declared} ({s.declared_by})"),
        ("hidden layers", hidden),
        ("tensors", f"{s.tensor_count} ({s.total_bytes:,} bytes, {human_size(s.total_bytes)})"),
    ]
    for layer in s.mtp_layers:
        state = "complete" if layer.complete else _incomplete(layer)
        rows.append(
            (
                f"MTP layer {layer.index}",
                f"{layer.prefix or '(heuristic)'}  {len(layer.present)} tensors, "
                f"{human_size(layer.nbytes)}, {'/'.join(layer.dtypes) or '-'}, {state}",
            )
        )
    columns = (Column("", no_wrap=False, style="dim"), Column("", no_wrap=False))
    return Grid(Cell(f"{label}{s.path}", "bold"), columns, tuple(rows), header=False)


def _table(report: Report) -> tuple[Block, ...]:
    labels = ("A: ", "B: ") if len(report.inputs) == 2 else ("",)
    pairs = zip(report.inputs, labels, strict=False)
    return tuple(block for s, label in pairs for block in (_grid(s, label), BLANK))


def _markdown(report: Report) -> str:
    header = ("input", "format", "family", "declared MTP", "MTP layers (complete/present)")
    return md_table("", header, (_md_row(s) for s in report.inputs))


def _md_row(s: CheckpointSummary) -> tuple[str, ...]:
    complete = sum(1 for layer in s.mtp_layers if layer.complete and layer.present)
    present = sum(1 for layer in s.mtp_layers if layer.present)
    declared = s.declared_mtp if s.declared_mtp is not None else "—"
    return (
        f"`{md_cell(s.path)}`",
        s.format,
        md_cell(s.family_display),
        f"{declared} ({md_cell(s.declared_by)})",
        f"{complete}/{present}",
    )


def _layer_json(layer: MtpLayerReport) -> dict[str, Any]:
    return {
        **pick(layer, "index prefix complete"),
        "tensors": list(layer.present),
        **pick(layer, "missing unreadable nbytes dtypes"),
    }


def _input_json(s: CheckpointSummary) -> dict[str, Any]:
    return {
        **pick(s, "path format family family_display model_type"),
        "declared_mtp_layers": s.declared_mtp,
        **pick(s, "declared_by num_hidden_layers tensor_count total_bytes"),
        "mtp_layers": [_layer_json(layer) for layer in s.mtp_layers],
    }


def _json(report: Report) -> dict[str, Any]:
    return {"inputs": [_input_json(s) for s in report.inputs]}


SECTION = Section("inputs", _table, _markdown, _json)
"""The inputs section: first in every format."""
