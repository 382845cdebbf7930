"""MkDocs hook: each command's options table, built from the options dataclass the CLI's
parameters and the API's keywords are generated from (``tests/test_declared_options.py``
checks that each page has its marker)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.accept.options import AcceptOptions  # noqa: E402
from mtpcheck.checks.options import DiffOptions, InspectOptions  # noqa: E402
from mtpcheck.declared import declared_fields, default_of, flag_of  # noqa: E402
from mtpcheck.pipeline.options import (  # noqa: E402
    HfToMegatronOptions,
    MegatronToHfOptions,
    RoundtripOptions,
)

COMMANDS: dict[str, tuple[str, type]] = {
    "accept": ("commands/accept.md", AcceptOptions),
    "inspect": ("commands/inspect.md", InspectOptions),
    "diff": ("commands/diff.md", DiffOptions),
    "roundtrip": ("commands/roundtrip.md", RoundtripOptions),
    "convert hf-to-megatron": ("commands/convert.md", HfToMegatronOptions),
    "convert megatron-to-hf": ("commands/convert.md", MegatronToHfOptions),
}
"""Each command: its page and its options dataclass."""


def marker(command: str) -> str:
    """Where ``command``'s table goes on its page."""
    return f"<!-- options: {command} -->"


def _default(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value in (None, (), False):
        return ""
    return f"`{value}`"


def options_table(cls: type) -> str:
    """One row per argument and option: the flag, its API keyword, its default, its help."""
    rows = ["| option | API keyword | default | what it does |", "|---|---|---|---|"]
    for f, declared in declared_fields(cls):
        name = flag_of(f, declared)
        if declared.metavar and not declared.is_argument:
            name = f"{name} {declared.metavar}"
        text = declared.help.replace("|", "\\|")
        rows.append(f"| `{name}` | `{f.name}` | {_default(default_of(f))} | {text} |")
    return "\n".join(rows)


def render(markdown: str, page: str) -> str:
    """The page with each of its commands' markers replaced; a missing marker is an error."""
    for command, (where, cls) in COMMANDS.items():
        if where != page:
            continue
        if marker(command) not in markdown:
            raise ValueError(f"docs/{page}: marker {marker(command)} is missing")
        markdown = markdown.replace(marker(command), options_table(cls))
    return markdown


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    return render(markdown, page.file.src_uri)
