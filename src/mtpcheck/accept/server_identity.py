"""Which engine serves ``--server``, in which version, under which model name.

The engine is told by its ``/metrics`` names (each engine prefixes its own), or named with
``--server-engine``; its version comes from the engine's version page. An engine whose
speculative-decoding metrics are not the ones :mod:`mtpcheck.accept.server_engines` knows is
refused with what the page holds, rather than read under names that may mean something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpcheck.accept.server_engines import ENGINES, ServingEngine
from mtpcheck.accept.server_http import Server, ServerError
from mtpcheck.accept.server_metrics import Reading, scrape
from mtpcheck.errors import shown_text
from mtpcheck.units import first_few


@dataclass(frozen=True)
class Served:
    """The engine a server runs, its version and the model it serves."""

    engine: ServingEngine
    version: str
    model: str

    @property
    def title(self) -> str:
        """The engine and its version, e.g. ``vLLM 0.32.0``."""
        return f"{self.engine.title} {self.version}"


def _by_names(reading: Reading, where: str) -> ServingEngine:
    found = [e for e in ENGINES.values() if any(n.startswith(e.metric_prefix) for n in
             reading.names())]  # fmt: skip
    if len(found) == 1:
        return found[0]
    names = sorted(reading.names())
    shown = first_few(names, 5)
    known = ", ".join(f"{e.metric_prefix}* ({e.key})" for e in ENGINES.values())
    raise ServerError(
        where,
        f"no serving engine mtpcheck knows exports these metrics ({shown or 'none'}); it "
        f"reads {known}; name one with --server-engine if a proxy renames them",
    )


def _unknown_spec_names(engine: ServingEngine, reading: Reading) -> list[str]:
    """Speculative-decoding samples of the engine that are not the names mtpcheck reads:
    a version that renamed them."""
    counters = engine.counters
    if counters is None:
        return []
    known = {
        counters.drafts,
        counters.draft_tokens,
        counters.accepted_tokens,
        counters.accepted_per_position,
        counters.drafted_per_position,
        *counters.other,
    }
    spec = [n for n in reading.names() if n.startswith(engine.metric_prefix) and "spec" in n]
    stems = {k.removesuffix("_total") for k in known if k}
    return sorted(n for n in spec if not any(n.startswith(s) for s in stems))


def _version(server: Server, engine: ServingEngine) -> str:
    page = server.probe(engine.version_page)
    value = page.get(engine.version_field) if isinstance(page, dict) else None
    return (
        shown_text(str(value), 40)
        if isinstance(value, str | int | float) and value
        else ("(version not told)")
    )


def _model(server: Server, given: str | None) -> str:
    if given:
        return given
    listing = server.get_json("/v1/models")
    models = listing.get("data") if isinstance(listing, dict) else None
    listed = models if isinstance(models, list) else []
    ids = [m["id"] for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not ids:
        raise ServerError(server.url("/v1/models"), "lists no model; name one with --server-model")
    if len(ids) > 1:
        raise ServerError(
            server.url("/v1/models"),
            f"serves {len(ids)} models ({shown_text(', '.join(ids), 200)}); name one with "
            "--server-model",
        )
    return str(ids[0])


def _detected(server: Server) -> tuple[ServingEngine, Reading]:
    """The engine whose metric prefix the server's metrics page carries (``/metrics``, then
    ``/prometheus/metrics``, where TensorRT-LLM keeps its Prometheus page), and that page."""
    failures = []
    for page in dict.fromkeys(e.metrics_page for e in ENGINES.values()):
        try:
            reading = scrape(server, page)
        except ServerError as e:
            failures.append(e)
            continue
        try:
            return _by_names(reading, server.url(page)), reading
        except ServerError as e:
            failures.append(e)
    raise failures[0]


def identify(server: Server, forced: str | None, model: str | None) -> Served:
    """The engine behind ``server`` (or the one ``--server-engine`` names), its version and
    the model to ask for."""
    if forced:
        engine = ENGINES[forced]
        reading = scrape(server, engine.metrics_page) if engine.counters else None
    else:
        engine, reading = _detected(server)
    if reading is not None:
        strange = _unknown_spec_names(engine, reading)
        if strange:
            raise ServerError(
                server.url(engine.metrics_page),
                f"{engine.title} {_version(server, engine)} exports speculative-decoding "
                f"metrics mtpcheck does not know ({', '.join(strange)}); it reads the names of "
                f"{engine.source}",
            )
    return Served(engine, _version(server, engine), _model(server, model))
