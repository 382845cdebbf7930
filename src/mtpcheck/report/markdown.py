"""Markdown summary, e.g. for ``$GITHUB_STEP_SUMMARY``."""

from __future__ import annotations

from typing import TextIO

from mtpcheck.model import Report, Status

ICON = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.WARN: "⚠️",
    Status.SKIP: "⏭️",
    Status.INFO: "ℹ️",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


class MarkdownRenderer:
    name = "markdown"

    def render(self, report: Report, stream: TextIO) -> None:
        verdict = Status.PASS if report.ok else Status.FAIL
        stream.write(f"## mtpcheck {report.command}: {ICON[verdict]} {verdict.value.upper()}\n\n")
        stream.write("| input | format | family | declared MTP | MTP layers (complete/present) |\n")
        stream.write("|---|---|---|---|---|\n")
        for s in report.inputs:
            complete = sum(1 for layer in s.mtp_layers if layer.complete and layer.present)
            present = sum(1 for layer in s.mtp_layers if layer.present)
            stream.write(
                f"| `{_cell(s.path)}` | {s.format} | {_cell(s.family_display)} | "
                f"{s.declared_mtp if s.declared_mtp is not None else '—'} "
                f"({_cell(s.declared_by)}) | {complete}/{present} |\n"
            )
        stream.write("\n| | check | subject | finding |\n|---|---|---|---|\n")
        for check in report.checks:
            for f in check.findings:
                subject = _cell(f.subject)
                stream.write(
                    f"| {ICON[f.status]} | {check.name} | `{subject}` | {_cell(f.message)} |\n"
                )
