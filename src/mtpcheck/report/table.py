"""Human-readable terminal output; the only module besides cli.py that uses rich."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mtpcheck.model import CheckpointSummary, Report, Status

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.WARN: "yellow",
    Status.SKIP: "dim",
    Status.INFO: "cyan",
}
MAX_ROWS_PER_CHECK = 25


def _input_table(s: CheckpointSummary, label: str) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False, title_justify="left")
    table.title = Text(f"{label}{s.path}", style="bold")
    table.add_column(style="dim")
    table.add_column()
    declared = "none" if s.declared_mtp is None else str(s.declared_mtp)
    hidden = str(s.num_hidden_layers) if s.num_hidden_layers is not None else "?"
    rows = [
        ("format", s.format),
        ("family", f"{s.family_display} (model_type {s.model_type or 'absent'})"),
        ("declared MTP layers", f"{declared} ({s.declared_by})"),
        ("hidden layers", hidden),
        ("tensors", f"{s.tensor_count} ({s.total_bytes:,} bytes)"),
    ]
    for layer in s.mtp_layers:
        state = "complete" if layer.complete else f"{len(layer.missing)} missing"
        rows.append(
            (
                f"MTP layer {layer.index}",
                f"{layer.prefix or '(heuristic)'}  {len(layer.present)} tensors, "
                f"{layer.nbytes:,} bytes, {'/'.join(layer.dtypes) or '-'}, {state}",
            )
        )
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    return table


class TableRenderer:
    name = "table"

    def __init__(self, color: bool | None = None, width: int | None = None) -> None:
        self.color = color
        self.width = width

    def render(self, report: Report, stream: TextIO) -> None:
        width = self.width or (None if stream.isatty() else 120)
        console = Console(
            file=stream,
            width=width,
            no_color=self.color is False,
            force_terminal=self.color,
            highlight=False,
        )
        labels = ("A: ", "B: ") if len(report.inputs) == 2 else ("",)
        for summary, label in zip(report.inputs, labels, strict=False):
            console.print(_input_table(summary, label))
            console.print()
        checks = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        checks.add_column("status")
        checks.add_column("check", no_wrap=True)
        checks.add_column("subject", overflow="fold", ratio=2)
        checks.add_column("finding", overflow="fold", ratio=3)
        for check in report.checks:
            shown = check.findings[:MAX_ROWS_PER_CHECK]
            for f in shown:
                checks.add_row(
                    Text(f.status.value.upper(), style=STYLE[f.status]),
                    Text(check.name),
                    Text(f.subject),
                    Text(f.message),
                )
            hidden = len(check.findings) - len(shown)
            if hidden:
                more = Text(f"... {hidden} more (use --format json)")
                checks.add_row(Text(""), Text(check.name), Text(""), more)
        console.print(checks)
        failed = [c.name for c in report.checks if c.status is Status.FAIL]
        verdict = (
            Text("PASS", style="bold green")
            if report.ok
            else Text(f"FAIL ({', '.join(failed)})", style="bold red")
        )
        console.print(Text("verdict: ").append(verdict))
