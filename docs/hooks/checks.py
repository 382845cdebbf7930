"""MkDocs hook: the check names' tables, built from the registry (``mtpcheck.model.CHECKS``):
every check on the check names page, and each page's own checks where it lists them
(``tests/test_check_names.py`` checks them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.model import CHECKS, CheckName  # noqa: E402
from mtpcheck.model.check_names import CheckGroup  # noqa: E402

ALL_MARKER = "<!-- check-names-table -->"
"""Where the table of every check goes."""

PAGES: dict[str, tuple[str, CheckGroup | None]] = {
    "checks.md": (ALL_MARKER, None),
    "commands/inspect.md": ("<!-- checkpoint-checks-table -->", "checkpoint"),
    "drafters.md": ("<!-- drafter-checks-table -->", "drafter"),
}
"""Each page with a table of checks: its marker, and the group it lists (None: every check)."""

GROUP_TITLES: dict[CheckGroup, str] = {
    "checkpoint": "a model checkpoint",
    "drafter": "a drafter",
    "diff": "two checkpoints compared",
    "roundtrip": "the round trip's stages",
    "source": "the round trip's source",
    "accept": "acceptance",
}
"""What each group's checks are about, in the table of every check."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def group_table(group: CheckGroup) -> str:
    """The ``inspect`` checks of one group: name and what it checks."""
    rows = ["| check | what it checks |", "|---|---|"]
    rows += [
        f"| `{name}` | {_cell(CHECKS[name].doc)} |"
        for name in CheckName
        if CHECKS[name].group == group and "inspect" in CHECKS[name].commands
    ]
    return "\n".join(rows)


def all_table() -> str:
    """Every check name, in the registry's order: what it checks, about what, which commands
    report it."""
    rows = ["| check | what it checks | about | reported by |", "|---|---|---|---|"]
    for name in CheckName:
        info = CHECKS[name]
        commands = ", ".join(f"`{c}`" for c in info.commands)
        about = GROUP_TITLES[info.group]
        rows.append(f"| `{name}` | {_cell(info.doc)} | {about} | {commands} |")
    return "\n".join(rows)


def render(markdown: str, page: str) -> str:
    """``page`` (relative to docs/) with its marker replaced; a missing marker is an error."""
    marker, group = PAGES[page]
    if marker not in markdown:
        raise ValueError(f"docs/{page}: marker {marker} is missing")
    return markdown.replace(marker, all_table() if group is None else group_table(group))


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri in PAGES:
        return render(markdown, page.file.src_uri)
    return markdown
