"""Human-readable terminal output (rich; the CLI's live progress bar is the only other user)."""

from __future__ import annotations

import os
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mtpcheck.model import (
    AcceptanceResult,
    CheckpointSummary,
    Estimate,
    MtpLayerReport,
    Report,
    Status,
)
from mtpcheck.units import human_size

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
        ("tensors", f"{s.tensor_count} ({s.total_bytes:,} bytes, {human_size(s.total_bytes)})"),
    ]
    for layer in s.mtp_layers:
        state = "complete" if layer.complete else _incomplete(layer)
        rows.append(
            (
                f"MTP layer {layer.index}",
                f"{layer.prefix or '(heuristic)'}  {len(layer.present)} tensors, "
                f"{human_size(layer.nbytes)}, {'/'.join(layer.dtypes) or '-'}, {state}",
            )
        )
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    return table


def _incomplete(layer: MtpLayerReport) -> str:
    parts = [f"{len(layer.missing)} missing"] if layer.missing else []
    if layer.unreadable:
        parts.append(f"{len(layer.unreadable)} unreadable")
    return ", ".join(parts)


def _ci(e: Estimate, signed: bool = False) -> str:
    value, low, high = e.value, e.low, e.high
    shown = f"{value:+.3f}" if signed else f"{value:.3f}"
    if low is None or high is None:
        return shown
    return (
        f"{shown} [{low:.3f}, {high:.3f}]" if not signed else f"{shown} [{low:+.3f}, {high:+.3f}]"
    )


def _acceptance_table(report: Report) -> Table:
    """accept: one row per (workload, checkpoint), plus B - A with --compare."""
    paths = list(dict.fromkeys(r.checkpoint for r in report.acceptance))
    label = {p: "AB"[i] for i, p in enumerate(paths)} if len(paths) == 2 else {}
    temperature = report.acceptance[0].temperature
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.title = Text(f"MTP acceptance (k=1, teacher-forced, T={temperature:g}, 95% CI)")
    table.title_justify = "left"
    for column in ("workload", "ckpt", "positions", "greedy", "alpha", "tokens/pass"):
        if column != "ckpt" or label:
            justify = "left" if column in ("workload", "ckpt") else "right"
            table.add_column(column, justify=justify, no_wrap=True)

    def row(r: AcceptanceResult) -> list[Text]:
        cells = [Text(r.workload)]
        if label:
            cells.append(Text(label[r.checkpoint]))
        greedy = _ci(r.greedy) if r.drafter else "no drafter"
        cells += [
            Text(f"{r.positions} / {r.sequences} seq"),
            Text(greedy, style="" if r.drafter else "yellow"),
            Text(_ci(r.alpha)),
            Text(f"{r.tokens_per_pass:.2f}"),
        ]
        return cells

    deltas = {d.workload: d for d in report.acceptance_deltas}
    for workload in dict.fromkeys(r.workload for r in report.acceptance):
        for r in report.acceptance:
            if r.workload == workload:
                table.add_row(*row(r))
        d = deltas.get(workload)
        if d is not None:
            table.add_row(
                Text(workload),
                Text("B-A"),
                Text(""),
                Text(_ci(d.greedy, signed=True)),
                Text(_ci(d.alpha, signed=True)),
                Text(f"{d.tokens_per_pass:+.2f}"),
            )
    return table


def _chain_table(report: Report) -> Table:
    """accept with several MTP layers: drafts 1..d all accepted, per depth d."""
    chained = [r for r in report.acceptance if r.chain is not None]
    paths = list(dict.fromkeys(r.checkpoint for r in report.acceptance))
    label = {p: "AB"[i] for i, p in enumerate(paths)} if len(paths) == 2 else {}
    first = chained[0]
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.title = Text(
        f"MTP acceptance by depth (chained, {first.chain.hidden if first.chain else ''} hidden "
        f"state; drafts 1..d all accepted; teacher-forced, T={first.temperature:g}, 95% CI)"
    )
    table.title_justify = "left"
    for column in ("workload", "ckpt", "positions", "d", "greedy", "alpha", "tokens/pass"):
        if column != "ckpt" or label:
            justify = "left" if column in ("workload", "ckpt") else "right"
            table.add_column(column, justify=justify, no_wrap=True)
    for r in chained:
        assert r.chain is not None
        for d in r.chain.depths:
            cells = [Text(r.workload)] + ([Text(label[r.checkpoint])] if label else [])
            cells += [
                Text(str(r.chain.positions) if d.depth == 1 else ""),
                Text(str(d.depth)),
                Text(_ci(d.greedy)),
                Text(_ci(d.alpha)),
                Text(f"{d.tokens_per_pass:.2f}"),
            ]
            table.add_row(*cells)
    return table


def _shares(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _online_table(report: Report) -> Table:
    """accept --online: what draft-then-verify decoding accepted, beside teacher forcing."""
    paths = list(dict.fromkeys(o.checkpoint for o in report.online))
    label = {p: "AB"[i] for i, p in enumerate(paths)} if len(paths) == 2 else {}
    temperature = report.online[0].temperature
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.title = Text(
        f"MTP acceptance online ({report.online[0].engine_title}, k={report.online[0].k}, "
        f"T={temperature:g}) at the drafted positions"
        + ("; per depth d: passes with drafts 1..d accepted" if report.online[0].k > 1 else "")
    )
    table.title_justify = "left"
    columns = ("workload", "ckpt", "passes", "online", "teacher-forced", "agree", "tokens/pass")
    counted = any(o.in_output is not None for o in report.online)
    if counted:  # transformers' counts beside what its output holds
        columns = (*columns, "in output")
    for column in columns:
        if column != "ckpt" or label:
            justify = "left" if column in ("workload", "ckpt") else "right"
            table.add_column(column, justify=justify, no_wrap=True)
    for o in report.online:
        cells = [Text(o.workload)] + ([Text(label[o.checkpoint])] if label else [])
        agree = f"{o.agreeing} / {o.drafts}" if o.agreeing is not None else "-"
        cells += [
            Text(f"{o.drafts} / {o.sequences} seq"),
            Text(_shares(o.online_by_depth)),
            Text(_shares(o.teacher_forced_by_depth)),
            Text(agree),
            Text(f"{o.tokens_per_pass:.2f}"),
        ]
        if counted:
            cells.append(Text(f"{o.in_output} / {o.drafts}" if o.in_output is not None else "-"))
        table.add_row(*cells)
    return table


def _engine_table(report: Report) -> Table:
    """accept --engine: what the serving engine's own counters say, one row per workload and
    draft position."""
    paths = list(dict.fromkeys(e.checkpoint for e in report.engine))
    label = {p: "AB"[i] for i, p in enumerate(paths)} if len(paths) == 2 else {}
    first = report.engine[0]
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.title = Text(
        f"MTP acceptance in {first.engine} ({first.parallel}, k={first.k}, "
        f"T={first.temperature:g}, 95% CI over requests); position i: steps whose drafts "
        "1..i were accepted"
    )
    table.title_justify = "left"
    tf = any(e.teacher_forced for e in report.engine)
    columns = ["workload", "ckpt", "steps", "pos", "accepted"]
    columns += ["teacher-forced"] if tf else []
    columns += ["mean length"]
    for column in columns:
        if column != "ckpt" or label:
            justify = "left" if column in ("workload", "ckpt") else "right"
            table.add_column(column, justify=justify, no_wrap=True)
    for e in report.engine:
        for i, share in enumerate(e.by_position):
            head = i == 0
            cells = [Text(e.workload if head else "")]
            cells += [Text(label[e.checkpoint] if head else "")] if label else []
            cells += [
                Text(f"{e.drafts} / {e.requests} req" if head else ""),
                Text(str(i + 1)),
                Text(_ci(share)),
            ]
            if tf:
                shown = f"{e.teacher_forced[i]:.3f}" if i < len(e.teacher_forced) else "-"
                if head and e.agreeing is not None:
                    shown += f" ({e.agreeing} agree)"
                cells.append(Text(shown))
            cells.append(Text(_ci(e.mean_acceptance_length) if head else ""))
            table.add_row(*cells)
    for d in report.engine_deltas:
        cells = [Text(d.workload)] + ([Text("B - A")] if label else [])
        cells += [Text(""), Text("1"), Text(_ci(d.first_position, signed=True))]
        cells += [Text("")] if tf else []
        cells.append(Text(_ci(d.mean_acceptance_length, signed=True)))
        table.add_row(*cells)
    return table


def _server_table(report: Report) -> Table:
    """accept --server: the engine's figures for mtpcheck's requests, one row per workload
    and draft position, with the checkpoint's offline figure where CKPT was given."""
    first = report.server[0]
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    table.title = Text(
        f"MTP acceptance served by {first.engine} at {first.server} (model {first.model}, "
        f"k={first.k if first.k is not None else '?'}, T={first.temperature:g}, 95% CI over "
        "requests); position i: steps whose drafts 1..i were accepted"
    )
    table.title_justify = "left"
    expected = any(r.expected for r in report.server)
    columns = ["workload", "steps", "pos", "accepted"]
    columns += ["offline"] if expected else []
    columns += ["mean length"]
    for column in columns:
        table.add_column(column, justify="left" if column == "workload" else "right", no_wrap=True)
    for r in report.server:
        shares = r.by_position or (r.acceptance,)
        steps = f"{r.drafts}" if r.drafts is not None else f"{r.draft_tokens} tok"
        for i, share in enumerate(shares):
            head = i == 0
            cells = [
                Text(r.workload if head else ""),
                Text(f"{steps} / {r.requests} req" if head else ""),
                Text(str(i + 1) if r.by_position else "all"),
                Text(_ci(share.estimate)),
            ]
            if expected:
                cells.append(Text(_ci(r.expected[i].estimate) if i < len(r.expected) else "-"))
            length = r.mean_acceptance_length
            cells.append(Text(_ci(length) if head and length is not None else ""))
            table.add_row(*cells)
    return table


class _Console(Console):
    """rich's console, except that a reader who left (``mtpcheck ... | head``) is reported as
    the ``BrokenPipeError`` it is: rich's default exits with status 1, which would read as a
    finding; the caller keeps the verdict's exit code."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


LOG_WIDTH = 120
"""Width of the report in a log (stdout not a terminal) unless ``COLUMNS`` says otherwise."""
MIN_FINDING = 40


def _longest(report: Report) -> tuple[int, int]:
    """Longest subject, and longest unbreakable word of a finding (a tensor name)."""
    subject, word = 7, 7
    for check in report.checks:
        for f in check.findings[:MAX_ROWS_PER_CHECK]:
            subject = max(subject, len(f.subject))
            word = max(word, *(len(w) for w in f.message.split()), 0)
    return subject, min(max(word, MIN_FINDING), 400)


def _log_width(report: Report) -> int:
    """``COLUMNS`` (or 120), widened until no name has to be split."""
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        width = LOG_WIDTH
    checks = max((len(c.name) for c in report.checks), default=5)
    subject, word = _longest(report)
    needed = len("status") + checks + subject + word + 3 * 2
    return max(width, needed)


class TableRenderer:
    name = "table"

    def __init__(self, color: bool | None = None, width: int | None = None) -> None:
        self.color = color
        self.width = width

    def render(self, report: Report, stream: TextIO) -> None:
        width = self.width or (None if stream.isatty() else _log_width(report))
        console = _Console(
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
        if report.acceptance:
            console.print(_acceptance_table(report))
            console.print()
        if any(r.chain is not None for r in report.acceptance):
            console.print(_chain_table(report))
        if report.online:
            console.print(_online_table(report))
            console.print()
        if report.engine:
            console.print(_engine_table(report))
            console.print()
        if report.server:
            console.print(_server_table(report))
            console.print()
        checks = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        subject_width, word_width = _longest(report)
        checks.add_column("status", no_wrap=True)
        checks.add_column("check", no_wrap=True)
        # a tensor name is never split across lines: the subject column is as wide as the
        # longest subject, and findings wrap only at spaces
        checks.add_column("subject", no_wrap=True, min_width=subject_width)
        checks.add_column("finding", overflow="fold", ratio=1, min_width=word_width)
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
