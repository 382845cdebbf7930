"""MkDocs hook: the environment variables' table on the options page, built from
``mtpcheck.settings.SETTINGS`` (``tests/test_settings.py`` checks it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.settings import SETTINGS  # noqa: E402

PAGE = "commands/options.md"
MARKER = "<!-- settings-table -->"


def settings_table() -> str:
    """Every variable: its name, its default and what it does."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {s.shown_default} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


def render(markdown: str) -> str:
    """The page with its marker replaced; a missing marker is an error."""
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE}: marker {MARKER} is missing")
    return markdown.replace(MARKER, settings_table())


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown
