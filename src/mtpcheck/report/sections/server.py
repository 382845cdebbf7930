"""``accept --server``: a running server's own figures for mtpcheck's requests, per workload
and draft position, with the checkpoint's offline figure where CKPT was given."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import Report, ServerAcceptance
from mtpcheck.report.blocks import BLANK, Block, CellLike, figure_grid, per_position
from mtpcheck.report.formatting import BY_POSITION, ci, md_cell, md_lead, md_table
from mtpcheck.report.json_values import estimate, pick, share
from mtpcheck.report.section import Section


def _rows(r: ServerAcceptance, expected: bool) -> list[tuple[CellLike, ...]]:
    steps = f"{r.drafts}" if r.drafts is not None else f"{r.draft_tokens} tok"
    positions = [
        [str(i + 1) if r.by_position else "all", ci(s.estimate)]
        + ([ci(r.expected[i].estimate) if i < len(r.expected) else "-"] if expected else [])
        for i, s in enumerate(r.by_position or (r.acceptance,))
    ]
    length = r.mean_acceptance_length
    tail = ci(length) if length is not None else ""
    return per_position([r.workload, f"{steps} / {r.requests} req"], positions, tail)


def _what(drafter: str) -> str:
    """What the table measures: the model's MTP layers, or a separate drafter."""
    return f"{drafter} acceptance" if drafter else "MTP acceptance"


def _table(report: Report) -> tuple[Block, ...]:
    first = report.server[0]
    k = first.k if first.k is not None else "?"
    run = f"model {first.model}, k={k}, T={first.temperature:g}, 95% CI over requests"
    title = (
        f"{_what(first.drafter)} served by {first.engine} at {first.server} ({run}); {BY_POSITION}"
    )
    expected = any(r.expected for r in report.server)
    optional = ("offline",) if expected else ()
    names = ("workload", "steps", "pos", "accepted", *optional, "mean length")
    rows = [row for r in report.server for row in _rows(r, expected)]
    return (figure_grid(title, names, False, rows), BLANK)


def _markdown(report: Report) -> str:
    first = report.server[0]
    k = first.k if first.k is not None else "?"
    detail = (
        f"(`{md_cell(first.server)}`, model `{md_cell(first.model)}`, k={k}, "
        f"T={first.temperature:g}, 95% CI over requests)"
    )
    lead = md_lead(f"{_what(first.drafter)} served by {first.engine}", detail)
    header = ("workload", "steps", "per position", "offline", "mean acceptance length")
    return md_table(lead, header, (_md_row(r) for r in report.server))


def _md_row(r: ServerAcceptance) -> tuple[str, ...]:
    length = r.mean_acceptance_length
    return (
        md_cell(r.workload),
        str(r.drafts) if r.drafts is not None else "—",
        " / ".join(ci(s.estimate) for s in r.by_position or (r.acceptance,)),
        " / ".join(ci(s.estimate) for s in r.expected) or "—",
        ci(length, ".2f") if length is not None else "—",
    )


_COUNTS = (
    "workload engine server model source k temperature requests prompt_tokens new_tokens "
    "generated_tokens drafts draft_tokens accepted_tokens accepted_per_position"
)
"""The server's run and counters, as the JSON report names them, in its order."""


def _server_json(r: ServerAcceptance) -> dict[str, Any]:
    length = r.mean_acceptance_length
    return {
        **pick(r, _COUNTS),
        "by_position": [share(s) for s in r.by_position],
        "acceptance": share(r.acceptance),
        "mean_acceptance_length": None if length is None else estimate(length),
        "expected": [share(s) for s in r.expected],
    }


def _json(report: Report) -> dict[str, Any]:
    return {"server_acceptance": [_server_json(r) for r in report.server]}


def _present(report: Report) -> bool:
    return bool(report.server)


SECTION = Section("server", _table, _markdown, _json, present=_present, accept_only=True)
"""A running server's acceptance."""
