"""``accept --online``: what draft-then-verify decoding accepted, beside the teacher-forced
figure at the very positions it drafted."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import OnlineAcceptance, Report
from mtpcheck.report.blocks import BLANK, Block, CellLike, figure_grid
from mtpcheck.report.formatting import ab_labels, md_cell, md_lead, md_table, shares
from mtpcheck.report.json_values import pick
from mtpcheck.report.section import Section

_COLUMNS = ("workload", "ckpt", "passes", "online", "teacher-forced", "agree", "tokens/pass")


def _row(o: OnlineAcceptance, label: dict[str, str], counted: bool) -> tuple[CellLike, ...]:
    cells = [o.workload] + ([label[o.checkpoint]] if label else [])
    agree = f"{o.agreeing} / {o.drafts}" if o.agreeing is not None else "-"
    cells += [
        f"{o.drafts} / {o.sequences} seq",
        shares(o.online_by_depth),
        shares(o.teacher_forced_by_depth),
        agree,
        f"{o.tokens_per_pass:.2f}",
    ]
    if counted:
        cells.append(f"{o.in_output} / {o.drafts}" if o.in_output is not None else "-")
    return tuple(cells)


def _table(report: Report) -> tuple[Block, ...]:
    label = ab_labels(o.checkpoint for o in report.online)
    first = report.online[0]
    title = (
        f"MTP acceptance online ({first.engine_title}, k={first.k}, "
        f"T={first.temperature:g}) at the drafted positions"
        + ("; per depth d: passes with drafts 1..d accepted" if first.k > 1 else "")
    )
    counted = any(o.in_output is not None for o in report.online)
    # transformers' counts beside what its output holds
    names = (*_COLUMNS, *(("in output",) if counted else ()))
    rows = [_row(o, label, counted) for o in report.online]
    return (figure_grid(title, names, bool(label), rows), BLANK)


def _markdown(report: Report) -> str:
    first = report.online[0]
    detail = f"({first.engine_title}, k={first.k}, T={first.temperature:g})"
    lead = md_lead("MTP acceptance online", f"{detail}, at the drafted positions")
    header = ("workload", "checkpoint", "passes", "online", "teacher-forced", "agree")
    return md_table(lead, (*header, "tokens/pass"), (_md_row(o) for o in report.online))


def _md_row(o: OnlineAcceptance) -> tuple[object, ...]:
    return (
        md_cell(o.workload),
        f"`{md_cell(o.checkpoint)}`",
        o.drafts,
        shares(o.online_by_depth),
        shares(o.teacher_forced_by_depth),
        f"{o.agreeing} / {o.drafts}" if o.agreeing is not None else "—",
        f"{o.tokens_per_pass:.2f}",
    )


_COUNTS = (
    "checkpoint workload temperature sequences prompt_tokens new_tokens drafts "
    "accepted_tokens online tokens_per_pass teacher_forced agreeing k"
)
"""The run and its counts, as the JSON report names them, in its order."""


def _online_json(o: OnlineAcceptance) -> dict[str, Any]:
    return {
        **pick(o, _COUNTS),
        "accepted_per_position": list(o.accepted_per_depth or (o.accepted,)),
        **pick(o, "teacher_forced_per_depth draft_rule engine in_output"),
    }


def _json(report: Report) -> dict[str, Any]:
    return {"online_acceptance": [_online_json(o) for o in report.online]}


def _present(report: Report) -> bool:
    return bool(report.online)


SECTION = Section("online", _table, _markdown, _json, present=_present, accept_only=True)
"""Online (draft-then-verify) acceptance."""
