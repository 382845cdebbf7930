"""Human-readable terminal output (rich; the CLI's live progress bar is the only other user).

The sections say what to show (:mod:`mtpcheck.report.blocks`); this module only turns their
grids and lines into rich tables and text."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mtpcheck.model import Report
from mtpcheck.report.blocks import Block, CellLike, Grid
from mtpcheck.report.sections import sections_for
from mtpcheck.report.sections.checks import needed_width


def _text(cell: CellLike) -> Text:
    return Text(cell) if isinstance(cell, str) else Text(cell.text, style=cell.style)


def _rich_table(grid: Grid) -> Table:
    table = Table(
        box=None,
        show_header=grid.header,
        header_style="bold",
        pad_edge=False,
        title_justify="left",
    )
    if grid.title is not None:
        table.title = _text(grid.title)
    for column in grid.columns:  # a Column's fields are rich's column options, by name
        table.add_column(**asdict(column))
    for row in grid.rows:
        table.add_row(*(_text(cell) for cell in row))
    return table


def _print(console: Console, block: Block) -> None:
    if isinstance(block, Grid):
        console.print(_rich_table(block))
    elif block.parts:
        console.print(Text.assemble(*(_text(part) for part in block.parts)))
    else:
        console.print()


class _Console(Console):
    """rich's console, except that a reader who left (``mtpcheck ... | head``) is reported as
    the ``BrokenPipeError`` it is: rich's default exits with status 1, which would read as a
    finding; the caller keeps the verdict's exit code."""

    def on_broken_pipe(self) -> None:
        """Stop writing, and let the caller see the closed pipe."""
        self.quiet = True
        raise BrokenPipeError


LOG_WIDTH = 120
"""Width of the report in a log (stdout not a terminal) unless ``COLUMNS`` says otherwise."""


def _log_width(report: Report) -> int:
    """``COLUMNS`` (or 120), widened until no name has to be split."""
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = LOG_WIDTH
    return max(width, needed_width(report))


class TableRenderer:
    """The terminal report: each section's tables and lines, in order."""

    name = "table"

    def __init__(self, color: bool | None = None, width: int | None = None) -> None:
        self.color = color
        self.width = width

    def render(self, report: Report, stream: TextIO) -> None:
        """Print ``report`` to ``stream``: as wide as a terminal is, in a log wide enough
        that no name is split."""
        width = self.width or (None if stream.isatty() else _log_width(report))
        console = _Console(
            file=stream,
            width=width,
            no_color=self.color is False,
            force_terminal=self.color,
            highlight=False,
        )
        for section in sections_for(report):
            if section.table is not None and section.present(report):
                for block in section.table(report):
                    _print(console, block)
