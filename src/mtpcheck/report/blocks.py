"""What a section shows on the terminal, as plain data: titled grids of cells and lines of
styled text. The table renderer turns them into rich objects, so the sections never import
rich (``--format json`` must not load it)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Cell:
    """A piece of text with a rich style (``""``: the console's default)."""

    text: str
    style: str = ""


CellLike = str | Cell
"""A plain string stands for a cell without style."""


@dataclass(frozen=True)
class Column:
    """One column of a grid: the rich column options the report uses, named as rich names
    them."""

    header: str
    justify: Literal["left", "right"] = "left"
    no_wrap: bool = True
    style: str | None = None
    min_width: int | None = None
    overflow: Literal["ellipsis", "fold"] = "ellipsis"
    ratio: int | None = None


@dataclass(frozen=True)
class Grid:
    """A table without borders: an optional title line above, a bold header row unless
    ``header`` is False."""

    title: Cell | None
    columns: tuple[Column, ...]
    rows: tuple[tuple[CellLike, ...], ...]
    header: bool = True


@dataclass(frozen=True)
class Line:
    """One line of text made of styled pieces; no pieces is an empty line."""

    parts: tuple[Cell, ...] = ()


Block = Grid | Line
"""What a section contributes to the terminal report, printed in order."""

BLANK = Line()
"""The empty line that separates the report's tables."""


def figure_columns(names: Iterable[str], ckpt: bool) -> tuple[Column, ...]:
    """Columns of a figures table: ``workload`` and ``ckpt`` left, the figures right; the
    ``ckpt`` column only when ``ckpt`` (two checkpoints compared)."""
    return tuple(
        Column(name, "left" if name in ("workload", "ckpt") else "right")
        for name in names
        if name != "ckpt" or ckpt
    )


def figure_grid(
    title: str, names: Iterable[str], ckpt: bool, rows: Iterable[tuple[CellLike, ...]]
) -> Grid:
    """A figures table of the ``accept`` sections."""
    return Grid(Cell(title), figure_columns(names, ckpt), tuple(rows))


def per_position(
    head: Sequence[str], positions: Iterable[Sequence[str]], tail: str
) -> list[tuple[CellLike, ...]]:
    """The rows of one entry, one per draft position: the entry's own cells (``head`` before
    the position's, ``tail`` after) on its first row only."""
    rows: list[tuple[CellLike, ...]] = []
    for i, cells in enumerate(positions):
        lead = list(head) if i == 0 else [""] * len(head)
        rows.append((*lead, *cells, tail if i == 0 else ""))
    return rows
