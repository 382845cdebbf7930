"""mtpcheck's own lines on stderr: a live ``rich`` bar on a terminal, plain lines elsewhere.

A CI log gets a line every few seconds (:mod:`mtpcheck.ticker`); a person at a terminal gets
one bar per long step, redrawn in place and removed when the step ends, so that only the closing
line stays. ``--quiet`` silences both. stdout is never touched.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

PREFIX = "mtpcheck: "


def _is_terminal(console: Console) -> bool:
    return console.is_terminal and not console.is_dumb_terminal


class _Bar:
    """One live bar; the line sink prints above it while it is shown."""

    def __init__(self, sink: StderrLog, label: str, total: int, unit: str) -> None:
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
            console=sink.console,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self.task: TaskID = self.progress.add_task(label, total=max(total, 1), at="")
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
        self.console = console if console is not None else Console(stderr=True, highlight=False)
        self.bar: _Bar | None = None

    def __call__(self, line: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:  # above the bar, which redraws below it
            self.console.print(Text(PREFIX + line), soft_wrap=True)
        else:
            click.echo(PREFIX + line, file=self.console.file)

    def live(self, label: str, total: int, unit: str = "") -> _Bar | None:
        """A bar for a long step, when stderr is a terminal (else ``None``: plain lines)."""
        if self.quiet or not _is_terminal(self.console) or self.bar is not None:
            return None
        self.bar = _Bar(self, label, total, unit)
        return self.bar
