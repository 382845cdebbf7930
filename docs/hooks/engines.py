"""MkDocs hook: the table of the serving engines ``accept --server`` reads, on the server page,
built from ``mtpcheck.accept.server_engines.ENGINES`` (``tests/test_docs.py`` checks it
renders): the metric names read, what a completion response holds per request, where the
version is, and where the names were read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mtpcheck.accept.server_engines import ENGINES, ServingEngine  # noqa: E402

PAGE = "acceptance/server.md"
MARKER = "<!-- server-engines-table -->"


def _per_request(e: ServingEngine) -> str:
    if not e.per_request_field:
        return e.per_request_how
    return f"`{e.per_request_field}` ({e.per_request_how})"


def _counters(e: ServingEngine) -> str:
    """The counters read, each by its sample name; the traffic counter last."""
    c = e.counters
    if c is None:
        return f"none usable: {e.counters_why_not}"
    named = [c.drafts, c.draft_tokens, c.accepted_tokens]
    parts = [f"`{n}`" for n in named if n is not None]
    label = f"{{{c.position_label}}}" if c.position_label else ""
    parts += [
        f"{what} per position `{n}{label}`"
        for what, n in (("accepted", c.accepted_per_position), ("drafted", c.drafted_per_position))
        if n is not None
    ]
    if c.requests is not None:
        parts.append(f"requests `{c.requests}`")
    else:
        parts.append(f"no request counter, so traffic is told by `{c.generated_tokens}`")
    return ", ".join(parts)


def engines_table() -> str:
    """One row per engine, in the order ``--server-engine`` lists them."""
    rows = [
        "| engine (`--server-engine`) | detected by | per request | counters | version from "
        "| names read in |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows += [
        f"| {e.title} (`{e.key}`) | `{e.metric_prefix}*` in `{e.metrics_page}` "
        f"| {_per_request(e)} | {_counters(e)} | `{e.version_page}` `{e.version_field}` "
        f"| {e.source} |"
        for e in ENGINES.values()
    ]
    return "\n".join(rows)


def render(markdown: str) -> str:
    """The page with its marker replaced; a missing marker is an error."""
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE}: marker {MARKER} is missing")
    return markdown.replace(MARKER, engines_table())


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: runs on each page's Markdown before it is converted to HTML."""
    if page.file.src_uri == PAGE:
        return render(markdown)
    return markdown
