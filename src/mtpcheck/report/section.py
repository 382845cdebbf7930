"""A section of the report and its renderings in every format, side by side.

Each module of ``report/sections/`` defines one :class:`Section`; the renderers walk
``report.sections.sections_for(report)`` in order and ask each section for its part, so a new
section is one module and one registry entry, and a renderer knows no section by name.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mtpcheck.model import Report
from mtpcheck.report.blocks import Block


@dataclass(frozen=True)
class Section:
    """One part of a report, rendered in each format it appears in (None: not in that
    format). Every rendering reads the finished report only."""

    name: str
    table: Callable[[Report], tuple[Block, ...]] | None = None
    """Terminal: grids and lines, printed in order."""
    markdown: Callable[[Report], str] | None = None
    """Markdown: the text written for the section."""
    json: Callable[[Report], dict[str, Any]] | None = None
    """JSON: the top-level keys the section contributes."""
    junit: Callable[[Report], tuple[ET.Element, ...]] | None = None
    """JUnit XML: ``testcase`` elements."""
    present: Callable[[Report], bool] = lambda _: True
    """Whether the report holds anything for the section: the terminal and Markdown show only
    the sections present (the JSON report has its keys all the same)."""
    accept_only: bool = False
    """JSON: the keys are in ``accept`` reports only (even when empty), after the keys of
    every command."""
