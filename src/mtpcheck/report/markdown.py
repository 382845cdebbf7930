"""Markdown summary, e.g. for ``$GITHUB_STEP_SUMMARY``: a heading with the verdict, then
each section's Markdown in order."""

from __future__ import annotations

from typing import TextIO

from mtpcheck.model import Report, Status
from mtpcheck.report.sections import sections_for
from mtpcheck.report.sections.checks import ICON


class MarkdownRenderer:
    """The Markdown report."""

    name = "markdown"

    def render(self, report: Report, stream: TextIO) -> None:
        """Write ``report`` to ``stream`` as Markdown."""
        verdict = Status.PASS if report.ok else Status.FAIL
        stream.write(f"## mtpcheck {report.command}: {ICON[verdict]} {verdict.value.upper()}\n\n")
        for section in sections_for(report):
            if section.markdown is not None and section.present(report):
                stream.write(section.markdown(report))
