"""Renderers of a finished report, keyed by the name the CLI exposes."""

from mtpcheck.report.interface import Renderer
from mtpcheck.report.json_ import JsonRenderer, error_dict
from mtpcheck.report.junit import JunitRenderer
from mtpcheck.report.markdown import MarkdownRenderer
from mtpcheck.report.table import TableRenderer

STDOUT_RENDERERS: dict[str, type[Renderer]] = {"table": TableRenderer, "json": JsonRenderer}
"""Choices of ``--format``."""

__all__ = [
    "STDOUT_RENDERERS",
    "JsonRenderer",
    "JunitRenderer",
    "MarkdownRenderer",
    "Renderer",
    "TableRenderer",
    "error_dict",
]
