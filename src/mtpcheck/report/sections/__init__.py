"""The report's sections, in the order the terminal and Markdown reports show them.

To add a section: one module here defining its ``SECTION`` (its rendering in each format),
and its place in :data:`ORDER`. The JSON report puts the keys of the sections every
command reports first, then those of ``accept`` (``Section.accept_only``), each group in
this order. The acceptance sections' modules are imported only for a report that holds
acceptance (an ``inspect`` or ``diff`` never imports them).
"""

from __future__ import annotations

from importlib import import_module

from mtpcheck.model import Report
from mtpcheck.report.section import Section

ORDER = ("inputs", "offline", "chain", "online", "engine", "server", "checks", "tensors")
"""Every section of a report, by module name, in order."""
ACCEPTANCE = frozenset({"offline", "chain", "online", "engine", "server"})
"""The sections that only an acceptance report holds."""


def _section(name: str) -> Section:
    section: Section = import_module(f"mtpcheck.report.sections.{name}").SECTION
    return section


def _measures_acceptance(report: Report) -> bool:
    """``accept``'s report, or any report holding acceptance figures."""
    figures = (report.acceptance, report.acceptance_deltas, report.online, report.engine,
               report.engine_deltas, report.server)  # fmt: skip
    return report.command == "accept" or any(figures)


def sections_for(report: Report) -> tuple[Section, ...]:
    """The sections that may show something of ``report``, in order."""
    with_acceptance = _measures_acceptance(report)
    return tuple(_section(name) for name in ORDER if with_acceptance or name not in ACCEPTANCE)


__all__ = ["ORDER", "Section", "sections_for"]
