"""MkDocs hook: the drafters page's tables, built from mtpcheck's drafter kinds.

``docs/drafters.md`` holds two markers, each replaced at build time by a Markdown table of the
records in ``mtpcheck.families.drafter_kinds``: what recognises each kind and what is checked,
and how each engine is told to draft with it. ``tests/test_docs.py`` checks them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.families.drafter_kinds import DRAFTER_KINDS, DrafterKind  # noqa: E402

PAGE = "drafters.md"
KINDS_MARKER = "<!-- drafter-kinds-table -->"
ENGINES_MARKER = "<!-- drafter-engines-table -->"


def _code(items: tuple[str, ...]) -> str:
    return ", ".join(f"`{i}`" for i in items)


def _recognised(k: DrafterKind) -> str:
    r = k.recognition
    parts = []
    if r.speculators_types:
        parts.append(f"`speculators_model_type` {_code(r.speculators_types)}")
    if r.architectures:
        parts.append(f"architecture {_code(r.architectures)}")
    if r.model_types:
        parts.append(f"`model_type` {_code(r.model_types)}")
    if r.tensors:
        parts.append(f"tensors {_code(r.tensors)}")
    return "; or ".join(parts)


def _checked(k: DrafterKind) -> str:
    return k.checked + (f"; **not checked:** {k.not_checked}" if k.not_checked else "")


def kinds_table() -> str:
    """What recognises each kind, its taps numbering, and what mtpcheck checks of it."""
    head = ["kind", "recognised by", "taps numbered as", "embedding and head", "checked"]
    rows = [
        [f"`{k.key}`: {k.display}", _recognised(k), k.taps.value, k.shared.value, _checked(k)]
        for k in DRAFTER_KINDS
    ]
    return _table(head, rows)


def engines_table() -> str:
    """How each engine is told to draft with each kind (empty: no setting known)."""
    head = ["kind", "vLLM `method`", "SGLang algorithm", "llama.cpp `--spec-type`", "note"]
    rows = [
        [
            f"`{k.key}`",
            f"`{k.engines.vllm}`" if k.engines.vllm else "",
            f"`{k.engines.sglang}`" if k.engines.sglang else "",
            f"`{k.engines.llama_cpp}`" if k.engines.llama_cpp else "",
            "; ".join(x for x in (k.engines.vllm_note, k.engines.other) if x),
        ]
        for k in DRAFTER_KINDS
    ]
    return _table(head, rows)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = [head, ["---"] * len(head), *rows]
    return "\n".join(
        "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in lines
    )


def render(markdown: str) -> str:
    """The page with both markers replaced; a missing marker is an error."""
    for marker, table in ((KINDS_MARKER, kinds_table), (ENGINES_MARKER, engines_table)):
        if marker not in markdown:
            raise ValueError(f"docs/{PAGE}: marker {marker} is missing")
        markdown = markdown.replace(marker, table())
    return markdown


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown
