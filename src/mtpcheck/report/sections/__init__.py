"""The report's sections, in the order the terminal and Markdown reports show them.

To add a section: one module here defining its ``SECTION`` (its rendering in each format),
and its place in :data:`SECTIONS`. The JSON report puts the keys of the sections every
command reports first, then those of ``accept`` (``Section.accept_only``), each group in
this order.
"""

from __future__ import annotations

from mtpcheck.report.section import Section
from mtpcheck.report.sections import chain, checks, engine, inputs, offline, online, server, tensors

SECTIONS: tuple[Section, ...] = (
    inputs.SECTION,
    offline.SECTION,
    chain.SECTION,
    online.SECTION,
    engine.SECTION,
    server.SECTION,
    checks.SECTION,
    tensors.SECTION,
)
"""Every section of a report, in order."""

__all__ = ["SECTIONS", "Section"]
