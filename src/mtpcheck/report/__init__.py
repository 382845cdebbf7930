"""Renderers of a finished report, keyed by the name the CLI exposes.

Each renderer's module is imported when it is asked for: ``--format json`` never imports rich.
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


def renderer(name: str) -> Renderer:
    """A renderer by name: ``table``, ``json``, ``junit`` or ``markdown``."""
    module, cls = _RENDERERS[name]
    made: Renderer = getattr(import_module(module), cls)()
    return made


__all__ = ["Renderer", "renderer"]
