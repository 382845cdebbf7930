"""``accept --engine``: what a serving engine's own counters say it accepted, per workload
and draft position, and the compared checkpoint minus the reference with ``--compare``."""

from __future__ import annotations

from typing import Any

from mtpcheck.model import EngineAcceptance, EngineDelta, Report
from mtpcheck.report.blocks import BLANK, Block, CellLike, figure_grid, per_position
from mtpcheck.report.formatting import (
    BY_POSITION,
    SIGNED,
    ab_labels,
    ci,
    md_cell,
    md_lead,
    md_table,
    shares,
)
from mtpcheck.report.json_values import estimate, pick
from mtpcheck.report.section import Section


def _teacher_forced(e: EngineAcceptance, i: int) -> str:
    """Position i's teacher-forced share, with the agreeing steps on the first position."""
    shown = f"{e.teacher_forced[i]:.3f}" if i < len(e.teacher_forced) else "-"
    if i == 0 and e.agreeing is not None:
        shown += f" ({e.agreeing} agree)"
    return shown


def _rows(e: EngineAcceptance, label: dict[str, str], tf: bool) -> list[tuple[CellLike, ...]]:
    head = [e.workload] + ([label[e.checkpoint]] if label else [])
    head.append(f"{e.drafts} / {e.requests} req")
    positions = [
        [str(i + 1), ci(share)] + ([_teacher_forced(e, i)] if tf else [])
        for i, share in enumerate(e.by_position)
    ]
    return per_position(head, positions, ci(e.mean_acceptance_length))


def _what(drafter: str) -> str:
    """What the table measures: the model's MTP layers, or a separate drafter."""
    return f"{drafter} acceptance" if drafter else "MTP acceptance"


def _table(report: Report) -> tuple[Block, ...]:
    label = ab_labels(e.checkpoint for e in report.engine)
    first = report.engine[0]
    run = f"{first.parallel}, k={first.k}, T={first.temperature:g}, 95% CI over requests"
    title = f"{_what(first.drafter)} in {first.engine} ({run}); {BY_POSITION}"
    tf = any(e.teacher_forced for e in report.engine)
    optional = ("teacher-forced",) if tf else ()
    names = ("workload", "ckpt", "steps", "pos", "accepted", *optional, "mean length")
    rows = [row for e in report.engine for row in _rows(e, label, tf)]
    rows += [_delta_row(d, bool(label), tf) for d in report.engine_deltas]
    return (figure_grid(title, names, bool(label), rows), BLANK)


def _delta_row(d: EngineDelta, ckpt: bool, tf: bool) -> tuple[CellLike, ...]:
    """Compared minus reference, at the first position and in mean length."""
    cells = [d.workload, *(["B - A"] if ckpt else []), "", "1", ci(d.first_position, SIGNED)]
    cells += [""] if tf else []
    return (*cells, ci(d.mean_acceptance_length, SIGNED))


def _markdown(report: Report) -> str:
    first = report.engine[0]
    detail = (
        f"({first.parallel}, k={first.k}, T={first.temperature:g}, 95% CI over requests; "
        "position i: steps with drafts 1..i accepted)"
    )
    lead = md_lead(f"{_what(first.drafter)} in {first.engine}", detail)
    header = ("workload", "checkpoint", "steps", "per position", "mean acceptance length")
    rows = [_md_row(e) for e in report.engine]
    rows += [
        (md_cell(d.workload), "B − A", None, ci(d.first_position, SIGNED))
        + (ci(d.mean_acceptance_length, "+.2f"), None)
        for d in report.engine_deltas
    ]
    return md_table(lead, (*header, "teacher-forced"), rows)


def _md_row(e: EngineAcceptance) -> tuple[object, ...]:
    return (
        md_cell(e.workload),
        f"`{md_cell(e.checkpoint)}`",
        e.drafts,
        " / ".join(ci(p) for p in e.by_position),
        ci(e.mean_acceptance_length, ".2f"),
        shares(e.teacher_forced) if e.teacher_forced else "—",
    )


_COUNTS = (
    "checkpoint workload engine parallel k temperature requests prompt_tokens new_tokens "
    "generated_tokens drafts draft_tokens accepted_tokens acceptance accepted_per_position"
)
"""The engine's run and counters, as the JSON report names them, in its order."""


def _engine_json(e: EngineAcceptance) -> dict[str, Any]:
    return {
        **pick(e, _COUNTS),
        "by_position": [estimate(p) for p in e.by_position],
        "mean_acceptance_length": estimate(e.mean_acceptance_length),
        **pick(e, "teacher_forced agreeing"),
    }


def _json(report: Report) -> dict[str, Any]:
    return {
        "engine_acceptance": [_engine_json(e) for e in report.engine],
        "engine_deltas": [
            {
                "workload": d.workload,
                "first_position": estimate(d.first_position),
                "mean_acceptance_length": estimate(d.mean_acceptance_length),
            }
            for d in report.engine_deltas
        ],
    }


def _present(report: Report) -> bool:
    return bool(report.engine)


SECTION = Section("engine", _table, _markdown, _json, present=_present, accept_only=True)
"""A serving engine's acceptance, with its differences under ``--compare``."""
