"""``accept`` with several MTP layers: teacher-forced acceptance by depth of the chain
(drafts 1..d all accepted). In JSON it is each acceptance entry's ``chain``."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import AcceptanceResult, ChainAcceptance, Report
from mtpcheck.report.blocks import Block, CellLike, figure_grid
from mtpcheck.report.formatting import ab_labels, ci, md_cell, md_lead, md_table
from mtpcheck.report.json_values import interval, rates
from mtpcheck.report.section import Section


def _chained(report: Report) -> list[AcceptanceResult]:
    return [r for r in report.acceptance if r.chain is not None]


def _rows(r: AcceptanceResult, label: dict[str, str]) -> list[tuple[CellLike, ...]]:
    assert r.chain is not None
    rows: list[tuple[CellLike, ...]] = []
    for d in r.chain.depths:
        cells = [r.workload] + ([label[r.checkpoint]] if label else [])
        positions = str(r.chain.positions) if d.depth == 1 else ""
        cells += [positions, str(d.depth), ci(d.greedy), ci(d.alpha), f"{d.tokens_per_pass:.2f}"]
        rows.append(tuple(cells))
    return rows


def _table(report: Report) -> tuple[Block, ...]:
    chained = _chained(report)
    label = ab_labels(r.checkpoint for r in report.acceptance)
    first = chained[0]
    title = (
        f"MTP acceptance by depth (chained, {first.chain.hidden if first.chain else ''} hidden "
        f"state; drafts 1..d all accepted; teacher-forced, T={first.temperature:g}, 95% CI)"
    )
    names = ("workload", "ckpt", "positions", "d", "greedy", "alpha", "tokens/pass")
    rows = [row for r in chained for row in _rows(r, label)]
    # no empty line after this table: the terminal report has always been laid out so
    return (figure_grid(title, names, bool(label), rows),)


def _markdown(report: Report) -> str:
    chained = _chained(report)
    hidden = chained[0].chain.hidden if chained[0].chain else ""
    detail = (
        f"(chained, {hidden} hidden state; drafts 1..d all accepted; teacher-forced, "
        f"T={chained[0].temperature:g}, 95% CI over sequences)"
    )
    lead = md_lead("MTP acceptance by depth", detail)
    header = ("workload", "checkpoint", "positions", "d", "greedy", "α", "tokens/pass")
    rows = (
        (md_cell(r.workload), f"`{md_cell(r.checkpoint)}`", r.chain.positions, d.depth)
        + (ci(d.greedy), ci(d.alpha), f"{d.tokens_per_pass:.2f}")
        for r in chained
        if r.chain is not None
        for d in r.chain.depths
    )
    return md_table(lead, header, rows)


def chain_json(c: ChainAcceptance) -> dict[str, Any]:
    """The JSON form of a chain's acceptance, nested in its acceptance entry."""
    depths = [
        {"depth": d.depth, **rates(d), "tokens_per_pass": d.tokens_per_pass} for d in c.depths
    ]
    return {
        "hidden": c.hidden,
        "positions": c.positions,
        "depths": depths,
        "tokens_per_pass": c.tokens_per_pass.value,
        "tokens_per_pass_ci": interval(c.tokens_per_pass),
        "greedy_tokens_per_pass": c.greedy_tokens_per_pass,
    }


def _present(report: Report) -> bool:
    return bool(_chained(report))


SECTION = Section("chain", _table, _markdown, present=_present)
"""Acceptance by depth of chained MTP layers (its JSON is in the offline section's)."""
