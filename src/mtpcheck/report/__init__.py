"""Renderers of a finished report, keyed by the name the CLI exposes.

Each renderer's module is imported when it is asked for: ``--format json`` never imports rich.
What each part of a report looks like in each format is in ``report/sections/``.
"""

from __future__ import annotations

from importlib import import_module

from mtpcheck.report.interface import Renderer

_RENDERERS = {
    "table": ("mtpcheck.report.table", "TableRenderer"),
    "json": ("mtpcheck.report.json_", "JsonRenderer"),
    "junit": ("mtpcheck.report.junit", "JunitRenderer"),
    "markdown": ("mtpcheck.report.markdown", "MarkdownRenderer"),
}

STDOUT_FORMATS = ("table", "json")
"""The formats a report can be printed in (``--format``); the others are written to files
(``--junit-xml``, ``--markdown``). The first is the default."""


def renderer(name: str) -> Renderer:
    """A renderer by name: ``table``, ``json``, ``junit`` or ``markdown``."""
    module, cls = _RENDERERS[name]
    made: Renderer = getattr(import_module(module), cls)()
    return made


__all__ = ["STDOUT_FORMATS", "Renderer", "renderer"]
