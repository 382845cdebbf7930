"""MkDocs hook: the table of the families mtpcheck's built-in converter writes to Megatron, and
how, on the convert page, built from the family records' ``support.writer`` (``MegatronWriter``)
and ``support.no_writer`` (``tests/test_docs.py`` checks it renders)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.families import FAMILIES, MtpFamily  # noqa: E402

PAGE = "commands/convert.md"
MARKER = "<!-- megatron-writers-table -->"
SPECS = {
    "local": "megatron-core's own modules (`local`)",
    "te": "Transformer Engine's (`te`)",
}
"""A writer's ``spec``, in words."""


def _plain(text: str) -> str:
    """Record prose as a table cell: a ``|`` would end the cell."""
    return text.replace("|", "\\|")


def _row(f: MtpFamily) -> str:
    """One family's row: the layout written, or why none is."""
    family = f"{_plain(f.display)} (`{f.key}`)"
    w = f.support.writer
    if w is None:
        elsewhere = "".join(f"; {c.words()}" for c in f.support.elsewhere)
        return f"| {family} | not written | — | — | {_plain(f.support.no_writer + elsewhere)} |"
    built = "yes" if w.builds_on_cpu else "no: the layout is written without building it"
    return f"| {family} | `{w.layout}` | {SPECS.get(w.spec, w.spec)} | {built} | {_plain(w.note)} |"


def writers_table() -> str:
    """Every family the built-in converter writes, then every family it refuses with a
    reason, in registry order."""
    rows = [
        "| family | Megatron layout written | layer spec | megatron-core builds it on CPU "
        "torch | what the layout needs |",
        "|---|---|---|---|---|",
    ]
    rows += [_row(f) for f in FAMILIES if f.support.writer is not None]
    rows += [_row(f) for f in FAMILIES if f.support.writer is None and f.support.no_writer]
    return "\n".join(rows)


def render(markdown: str) -> str:
    """The page with its marker replaced; a missing marker is an error."""
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE}: marker {MARKER} is missing")
    return markdown.replace(MARKER, writers_table())


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown
