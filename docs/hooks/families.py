"""MkDocs hook: the families page's tables, built from mtpcheck's family registry.

``docs/families.md`` holds two markers; each becomes a Markdown table rendered from the
records in ``mtpcheck.families`` at build time, so the page cannot disagree with the code.
``tests/test_docs.py`` imports this module to check the tables against the registry.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# the checkout's own sources, so the tables describe this tree even where another mtpcheck
# is installed
SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.families import FAMILIES, CopyPolicy, Drafter, MtpFamily  # noqa: E402
from mtpcheck.families.catalog import GGUF, MEGATRON, MEGATRON_HYBRID  # noqa: E402

PAGE = "families.md"
MODEL_MARKER = "<!-- families-table -->"
FORMAT_MARKER = "<!-- format-families-table -->"
FORMAT_FAMILIES = (MEGATRON, MEGATRON_HYBRID, GGUF)
"""Records of a checkpoint format's own names, whatever model the checkpoint holds."""

COLUMNS = (
    "family key",
    "checkpoints (`model_type`)",
    "count key (when absent)",
    "MTP layer `i` lives at",
    "MTP-only tensors",
    "copies of main tensors",
    "projection concat",
    "built-in converter",
    "HF <-> Megatron mapping",
    "`accept`",
    "notes",
)


def short_name(family: MtpFamily, template: str) -> str:
    """A tensor template relative to the MTP layer (its prefix, or the prefix above its
    ``transformer_layer.``), without ``.weight``."""
    layer_prefix = family.layout.layer_prefix
    for prefix in (layer_prefix, layer_prefix.removesuffix("transformer_layer.")):
        if template.startswith(prefix):
            template = template[len(prefix) :]
            break
    return template.removesuffix(".weight")


def _code(items: Iterable[str]) -> str:
    return ", ".join(f"`{item}`" for item in items)


def plain(text: str) -> str:
    """Registry prose as Markdown text: what would read as markup outside its code spans
    (``<model>``, ``ple.*``, ``|``) is escaped."""
    parts = text.split("`")
    for k in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[k] = re.sub(r"([\\*_|])", r"\\\1", parts[k])
        parts[k] = parts[k].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _checkpoints(f: MtpFamily) -> str:
    name = plain(f.display)
    cell = f"{name} ({_code(f.model_types)})" if f.model_types else name
    if f.drafter is Drafter.SEPARATE:
        cell += "; its drafter is a checkpoint of its own"
    elif f.drafter is Drafter.IS_DRAFTER:
        cell += "; the checkpoint is a drafter"
    return cell


def _count(f: MtpFamily) -> str:
    absent = "undeclared" if f.count.default is None else str(f.count.default)
    return f"{_code(f.count.keys)} ({absent})"


def _location(f: MtpFamily) -> str:
    if f.drafter is not Drafter.INSIDE:
        return "—"
    cell = f"`{f.layout.layer_prefix}`"
    if f.layout.main_layer_prefix != "model.layers.{k}.":
        cell += f" (main layers: `{f.layout.main_layer_prefix}`)"
    if f.layout.block_lacks:
        cell += "; its block lacks the main layers' " + _code(f"{p}*" for p in f.layout.block_lacks)
    if f.layout.flat_layers_keys:
        cell += "; a depth spans the layers of " + " or ".join(
            f"`{mtp_key}`" for mtp_key, _ in f.layout.flat_layers_keys
        )
    return cell


def _copies(f: MtpFamily) -> str:
    layout = f.layout
    if not layout.copies or layout.copy_policy is CopyPolicy.NONE:  # never stored, not compared
        return "none"
    return f"{_code(short_name(f, c.template) for c in layout.copies)} ({layout.copy_policy.value})"


def _converter(f: MtpFamily) -> str:
    if f.support.writer is None:
        why = f": {plain(f.support.no_writer)}" if f.support.no_writer else ""
        others = "; ".join(plain(c.words()) for c in f.support.elsewhere)
        return f"no{why}" + (f"; {others}" if others else "")
    cell = "yes"
    if f.support.writer.layout != f.key:
        cell += f" (as `{f.support.writer.layout}`)"
    return f"{cell}, {f.support.writer.spec} spec"


def _accept(f: MtpFamily) -> str:
    if f.support.accept.measurable:
        return "yes"
    return f"no: {plain(f.support.accept.why_not)}" if f.support.accept.why_not else "no (not yet)"


def row(f: MtpFamily) -> list[str]:
    """One family's cells, in the order of ``COLUMNS``."""
    return [
        f"`{f.key}`",
        _checkpoints(f),
        _count(f),
        _location(f),
        _code(short_name(f, t) for t in f.layout.specific) or "—",
        _copies(f),
        f.layout.concat_order.value,
        _converter(f),
        "yes" if f.megatron is not None else "no",
        _accept(f),
        plain(f.notes),
    ]


def families_table(families: Iterable[MtpFamily] | None = None) -> str:
    """A Markdown table of ``families`` (default: every model family in the registry)."""
    if families is None:
        families = [f for f in FAMILIES if f not in FORMAT_FAMILIES]
    lines = [COLUMNS, ["---"] * len(COLUMNS), *(row(f) for f in families)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def render(markdown: str) -> str:
    """The families page with both markers replaced; a missing marker is an error, so the
    tables cannot silently drop out of the page."""
    for marker, families in ((MODEL_MARKER, None), (FORMAT_MARKER, FORMAT_FAMILIES)):
        if marker not in markdown:
            raise ValueError(f"docs/{PAGE}: marker {marker} is missing")
        markdown = markdown.replace(marker, families_table(families))
    return markdown


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown
