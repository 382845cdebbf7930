"""``accept``: offline (teacher-forced, k = 1) acceptance per checkpoint and workload, and
the compared checkpoint minus the reference with ``--compare``."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import AcceptanceDelta, AcceptanceResult, Report
from mtpcheck.report.blocks import BLANK, Block, Cell, CellLike, figure_grid
from mtpcheck.report.formatting import SIGNED, ab_labels, ci, md_cell, md_lead, md_table
from mtpcheck.report.json_values import pick, rates
from mtpcheck.report.section import Section
from mtpcheck.report.sections.chain import chain_json


def _row(r: AcceptanceResult, label: dict[str, str]) -> tuple[CellLike, ...]:
    cells: list[CellLike] = [r.workload, *([label[r.checkpoint]] if label else [])]
    greedy = ci(r.greedy) if r.drafter else Cell("no drafter", "yellow")
    cells += [f"{r.positions} / {r.sequences} seq", greedy, ci(r.alpha), f"{r.tokens_per_pass:.2f}"]
    return tuple(cells)


def _delta_row(d: AcceptanceDelta) -> tuple[CellLike, ...]:
    greedy, alpha = ci(d.greedy, SIGNED), ci(d.alpha, SIGNED)
    return (d.workload, "B-A", "", greedy, alpha, f"{d.tokens_per_pass:+.2f}")


def _by_workload(report: Report) -> list[tuple[list[AcceptanceResult], AcceptanceDelta | None]]:
    """Per workload, in order: its entries and the difference between them (if compared)."""
    deltas = {d.workload: d for d in report.acceptance_deltas}
    return [
        ([r for r in report.acceptance if r.workload == workload], deltas.get(workload))
        for workload in dict.fromkeys(r.workload for r in report.acceptance)
    ]


def _table(report: Report) -> tuple[Block, ...]:
    label = ab_labels(r.checkpoint for r in report.acceptance)
    rows: list[tuple[CellLike, ...]] = []
    for results, delta in _by_workload(report):
        rows += [_row(r, label) for r in results]
        rows += [_delta_row(delta)] if delta is not None else []
    title = f"MTP acceptance (k=1, teacher-forced, T={report.acceptance[0].temperature:g}, 95% CI)"
    names = ("workload", "ckpt", "positions", "greedy", "alpha", "tokens/pass")
    return (figure_grid(title, names, bool(label), rows), BLANK)


def _markdown(report: Report) -> str:
    temperature = report.acceptance[0].temperature
    detail = f"(k=1, teacher-forced, T={temperature:g}, 95% CI over sequences)"
    lead = md_lead("MTP acceptance", detail)
    header = ("workload", "checkpoint", "positions", "greedy", "α", "tokens/pass")
    rows: list[tuple[object, ...]] = []
    for results, d in _by_workload(report):
        rows += [_md_row(r) for r in results]
        if d is not None:
            greedy, alpha = ci(d.greedy, SIGNED), ci(d.alpha, SIGNED)
            rows.append(
                (md_cell(d.workload), "B − A", None, greedy, alpha, f"{d.tokens_per_pass:+.2f}")
            )
    return md_table(lead, header, rows)


def _md_row(r: AcceptanceResult) -> tuple[object, ...]:
    return (
        md_cell(r.workload),
        f"`{md_cell(r.checkpoint)}`",
        r.positions,
        ci(r.greedy) if r.drafter else "no drafter",
        ci(r.alpha),
        f"{r.tokens_per_pass:.2f}",
    )


def _acceptance_json(r: AcceptanceResult) -> dict[str, Any]:
    return {
        **pick(r, "checkpoint workload drafter note sequences positions greedy_hits"),
        **rates(r),
        **pick(r, "tokens_per_pass temperature"),
        "chain": chain_json(r.chain) if r.chain is not None else None,
    }


def _json(report: Report) -> dict[str, Any]:
    return {
        "acceptance": [_acceptance_json(r) for r in report.acceptance],
        "acceptance_deltas": [
            {"workload": d.workload, **rates(d), "tokens_per_pass": d.tokens_per_pass}
            for d in report.acceptance_deltas
        ],
    }


def _present(report: Report) -> bool:
    return bool(report.acceptance)


SECTION = Section("offline", _table, _markdown, _json, present=_present, accept_only=True)
"""Offline acceptance, with its differences under ``--compare``."""
