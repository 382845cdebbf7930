"""Figures as the report writes them, shared by the sections: intervals and shares as text,
Markdown tables, the A/B labels of two checkpoints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mtpcheck.model import Estimate

SIGNED = "+.3f"
"""The format of a difference between two checkpoints (B - A)."""
BY_POSITION = "position i: steps whose drafts 1..i were accepted"
"""What a figure at draft position i counts (a serving engine's acceptance)."""


def ci(e: Estimate, fmt: str = ".3f") -> str:
    """A value with its 95 % interval, ``0.500 [0.400, 0.600]``, or the value alone."""
    shown = format(e.value, fmt)
    return shown if e.low is None or e.high is None else f"{shown} [{e.low:{fmt}}, {e.high:{fmt}}]"


def shares(values: Iterable[float]) -> str:
    """Shares per depth or position, ``0.667 / 0.333``."""
    return " / ".join(f"{v:.3f}" for v in values)


def md_cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def md_lead(title: str, detail: str) -> str:
    """The bold title and details above a Markdown table of figures."""
    return f"\n**{title}** {detail}\n\n"


def md_table(lead: str, header: Sequence[str | None], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table after ``lead`` (a heading, or the empty lines before the table); a
    cell of None is left empty."""
    lines = [lead, _md_row(header), "|---" * len(header) + "|\n"]
    lines += [_md_row(row) for row in rows]
    return "".join(lines)


def _md_row(cells: Sequence[object]) -> str:
    return "|" + "".join(" |" if c is None else f" {c} |" for c in cells) + "\n"


def ab_labels(paths: Iterable[str]) -> dict[str, str]:
    """``A`` and ``B`` for the reference and the compared checkpoint, in order of first
    appearance; empty unless there are exactly two."""
    distinct = list(dict.fromkeys(paths))
    return {p: "AB"[i] for i, p in enumerate(distinct)} if len(distinct) == 2 else {}
