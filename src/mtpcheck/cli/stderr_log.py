"""mtpcheck's own lines on stderr: a live ``rich`` bar on a terminal, plain lines elsewhere.

A CI log gets a line every few seconds (:mod:`mtpcheck.ticker`); a person at a terminal gets
one bar per long step, redrawn in place and removed when the step ends, so that only the closing
line stays. ``--quiet`` silences both. stdout is never touched.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console

PREFIX = "mtpcheck: "


def _stderr_console() -> Console | None:
    """A rich console on stderr when stderr is a terminal; None otherwise (rich is then not
    even imported: a CI log never pays for it)."""
    if not sys.stderr.isatty() or os.environ.get("TERM") == "dumb":
        return None
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return console if console.is_terminal and not console.is_dumb_terminal else None


class _Bar:
    """One live bar; the line sink prints above it while it is shown."""

    def __init__(self, sink: StderrLog, console: Console, label: str, total: int, unit: str):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.sink = sink
        amounts: tuple[ProgressColumn, ...] = (
            (DownloadColumn(binary_units=True), TransferSpeedColumn())
            if not unit
            else (MofNCompleteColumn(), TextColumn(unit))
        )
        self.progress = Progress(
            TextColumn(PREFIX + "{task.description}"),
            BarColumn(),
            *amounts,
            TimeRemainingColumn(),
            TextColumn("{task.fields[at]}", style="dim"),
            console=console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task = self.progress.add_task(label, total=max(total, 1), at="")
        self.progress.start()

    def update(self, done: int, at: str) -> None:
        self.progress.update(self.task, completed=done, at=at)

    def close(self) -> None:
        self.progress.stop()
        if self.sink.bar is self:
            self.sink.bar = None


class StderrLog:
    """Callable line sink (``log(line)``) that also draws live bars on a terminal."""

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console
        """Where bars go: given (tests), else a console on stderr if it is a terminal."""
        self.bar: _Bar | None = None
        self._looked = console is not None

    def _terminal(self) -> Console | None:
        if not self._looked:
            self.console, self._looked = _stderr_console(), True
        console = self.console
        if console is None or not console.is_terminal or console.is_dumb_terminal:
            return None
        return console

    def __call__(self, line: str) -> None:
        if self.quiet:
            return
        if self.bar is not None and self.console is not None:  # above the bar, redrawn below
            from rich.text import Text

            self.console.print(Text(PREFIX + line), soft_wrap=True)
        else:
            file = self.console.file if self.console is not None else sys.stderr
            click.echo(PREFIX + line, file=file)

    def live(self, label: str, total: int, unit: str = "") -> _Bar | None:
        """A bar for a long step, when stderr is a terminal (else ``None``: plain lines)."""
        if self.quiet or self.bar is not None:
            return None
        console = self._terminal()
        if console is None:
            return None
        self.bar = _Bar(self, console, label, total, unit)
        return self.bar
