"""Sending one workload to a running server and reading what its engine counted for exactly
those requests.

Two ways, by what the engine gives:

* **per-request**: the figures ride in each completion response (vLLM with
  ``--per-request-spec-decode-metrics``, SGLang's ``meta_info``, llama.cpp's ``timings``);
  requests go ``concurrency`` at a time, and the counters, when no one else's requests moved
  them, must add up to the same totals;
* **counters**: only ``/metrics`` counts. The engine's request counter must move by exactly
  the requests sent, else another client's traffic is in the figures and the run is
  refused. With ``--concurrency 1`` each request is bracketed by two scrapes and has figures
  of its own (intervals over requests); otherwise the workload counts as one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mtpcheck.accept.server_answers import OddAnswer, count, position
from mtpcheck.accept.server_engines import ServedRequest, ServingEngine
from mtpcheck.accept.server_http import Server, ServerError
from mtpcheck.accept.server_metrics import Reading, moved, moved_by_label, scrape

#: How long the counters may lag the last response before the run is refused (seconds).
SETTLE_SECONDS = 30.0
#: Requests in flight at once where the engine gives per-request figures.
DEFAULT_CONCURRENCY = 32

Prompt = list[int] | str


@dataclass(frozen=True)
class Sent:
    """What the engine counted for one workload's requests."""

    requests: tuple[ServedRequest, ...]
    source: str
    """``per-request`` or ``counters``."""
    note: str = ""
    """Anything the reader should know, e.g. that the counters could not cross-check."""


def completion_body(
    engine: ServingEngine, model: str, prompt: Prompt, new_tokens: int, temperature: float
) -> dict[str, Any]:
    """One OpenAI completions request: token ids where we have them, text otherwise; a fixed
    seed, so that a sampled run repeats where the engine honours it; whatever the engine
    needs asked to return its per-request figures."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": new_tokens,
        "temperature": temperature,
        "seed": 0,
        "stream": False,
        **dict(engine.request_extra),
    }


def _complete(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    answer = server.post_json("/v1/completions", body)
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        raise ServerError(
            server.url("/v1/completions"), "answered without an OpenAI completion ('usage')"
        )
    try:
        _generated(answer)  # read once here, where the URL is known
    except OddAnswer as e:
        raise ServerError(server.url("/v1/completions"), str(e)) from e
    return answer


def _settled(server: Server, engine: ServingEngine, before: Reading, expected: int) -> Reading:
    """Scrape until the engine's request counter has moved by ``expected`` (its counters are
    updated just after the response leaves) or :data:`SETTLE_SECONDS` pass."""
    assert engine.counters is not None
    where = server.url(engine.metrics_page)
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        after = scrape(server, engine.metrics_page)
        done = moved(before, after, engine.counters.traffic, where)
        if done >= expected or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def _ours(engine: ServingEngine, answers: Sequence[dict[str, Any]]) -> int:
    """How far the engine's traffic counter moves for these answers: one per request, or
    their generated tokens where the engine counts no requests."""
    assert engine.counters is not None
    if engine.counters.requests:
        return len(answers)
    return sum(_generated(a) for a in answers)


def _generated(answer: dict[str, Any]) -> int:
    what = "usage.completion_tokens"
    return count(answer["usage"].get("completion_tokens", 0), what)  # usage: _complete's


def from_counters(
    engine: ServingEngine, before: Reading, after: Reading, generated: int, where: str
) -> ServedRequest:
    """The figures between two scrapes, as one request's (``where``: the metrics page)."""
    try:
        return _between(engine, before, after, generated, where)
    except OddAnswer as e:
        raise ServerError(where, str(e)) from e


def _between(
    engine: ServingEngine, before: Reading, after: Reading, generated: int, where: str
) -> ServedRequest:
    counters = engine.counters
    assert counters is not None
    per_position = None
    if counters.accepted_per_position and counters.position_label:
        by_label = moved_by_label(
            before, after, counters.accepted_per_position, counters.position_label, where
        )
        name = counters.accepted_per_position
        by_position = {position(k, name): v for k, v in by_label.items()}
        per_position = tuple(count(by_position[k], name) for k in sorted(by_position))
    drafts = None
    if counters.drafts:
        drafts = count(moved(before, after, counters.drafts, where), counters.drafts)
    elif counters.drafted_per_position and counters.position_label:
        made = moved_by_label(
            before, after, counters.drafted_per_position, counters.position_label, where
        )
        drafts = count(made.get("0", 0), counters.drafted_per_position)
    return ServedRequest(
        generated_tokens=generated,
        drafts=drafts,
        draft_tokens=count(
            moved(before, after, counters.draft_tokens, where), counters.draft_tokens
        ),
        accepted_tokens=count(
            moved(before, after, counters.accepted_tokens, where), counters.accepted_tokens
        ),
        accepted_per_position=per_position,
    )


def _settled_exactly(
    server: Server, engine: ServingEngine, before: Reading, ours: int, where: str
) -> Reading:
    """:func:`_settled`, where the traffic counter must have moved by exactly ``ours``: any
    more is another client's requests (:class:`ServerError`)."""
    assert engine.counters is not None
    after = _settled(server, engine, before, ours)
    counted = moved(before, after, engine.counters.traffic, where)
    if counted != ours:
        raise _other_traffic(where, engine.counters.traffic, counted, ours)
    return after


def _other_traffic(where: str, name: str, counted: float, ours: int) -> ServerError:
    return ServerError(
        where,
        f"{name} moved by {counted:g} where mtpcheck's requests account for {ours}: another "
        "client's requests are in the counters; measure on a server (or replica) no one else "
        "uses now",
    )


def send_workload(
    server: Server,
    engine: ServingEngine,
    model: str,
    prompts: Sequence[Prompt],
    new_tokens: int,
    temperature: float,
    concurrency: int | None,
    progress: Callable[[int], None] = lambda _: None,
) -> Sent:
    """Every prompt of one workload; the figures per request where the engine gives them,
    else from its counters: one request at a time (``concurrency`` 1, the default for such
    an engine) so that each has its own, or the workload's requests as one."""
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY if engine.per_request else 1
    bodies = [completion_body(engine, model, p, new_tokens, temperature) for p in prompts]
    where = server.url(engine.metrics_page)
    before = scrape(server, engine.metrics_page) if engine.counters else Reading()
    if concurrency == 1 and engine.counters is not None:
        return _one_by_one(server, engine, bodies, before, progress)
    answers = _all_at_once(server, bodies, concurrency, progress)
    figures = [_figures(server, engine, a) for a in answers]
    if all(f is not None for f in figures):
        requests = tuple(f for f in figures if f is not None)
        note = _cross_check(server, engine, before, requests, where) if engine.counters else ""
        return Sent(requests, "per-request", note)
    if any(f is not None for f in figures):
        raise ServerError(
            server.url("/v1/completions"),
            f"{engine.title} gave per-request figures for some requests and not others",
        )
    if engine.counters is None:
        if engine.request_extra:
            # mtpcheck asked for the figures, and an engine that drafts gives them: none at
            # all is a server that drafts nothing (SGLang adds them only with a speculative
            # algorithm set)
            return Sent(tuple(_undrafted(a) for a in answers), "per-request")
        raise ServerError(
            server.url("/v1/completions"),
            f"{engine.title} gave no per-request speculative-decoding figures; start it with "
            f"{engine.per_request_how}",
        )
    ours = _ours(engine, answers)
    after = _settled_exactly(server, engine, before, ours, where)
    generated = sum(_generated(a) for a in answers)
    whole = from_counters(engine, before, after, generated, where)
    return Sent(
        (whole,),
        "counters",
        f"{engine.title} gave no per-request figures ({engine.per_request_how} turns them on): "
        f"its counters over all {len(bodies)} requests, as one (no interval; --concurrency 1 "
        "reads them request by request)",
    )


def _figures(server: Server, engine: ServingEngine, answer: dict[str, Any]) -> ServedRequest | None:
    """The engine's per-request figures in one answer (None where it gives none)."""
    if engine.per_request is None:
        return None
    try:
        return engine.per_request(answer)
    except OddAnswer as e:
        raise ServerError(server.url("/v1/completions"), f"{engine.title} {e}") from e


def _undrafted(answer: dict[str, Any]) -> ServedRequest:
    return ServedRequest(_generated(answer), 0, 0, 0, None)


def _all_at_once(
    server: Server, bodies: list[dict[str, Any]], concurrency: int, progress: Callable[[int], None]
) -> list[dict[str, Any]]:
    """Up to ``concurrency`` requests in flight, the first wave released together: an engine
    batches what arrives together, and its figures can depend on the batches (a fresh vLLM
    server given a workload's prompts at once counts as its offline engine given them in one
    call)."""
    wave = threading.Barrier(min(concurrency, len(bodies)))

    def send(index: int) -> dict[str, Any]:
        if index < wave.parties:
            wave.wait(timeout=60)
        return _complete(server, bodies[index])

    answers = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for answer in pool.map(send, range(len(bodies))):
            answers.append(answer)
            progress(len(answers))
    return answers


def _one_by_one(
    server: Server,
    engine: ServingEngine,
    bodies: list[dict[str, Any]],
    before: Reading,
    progress: Callable[[int], None],
) -> Sent:
    """One request at a time, each between two scrapes: its own figures from the counters."""
    assert engine.counters is not None
    where = server.url(engine.metrics_page)
    requests = []
    for index, body in enumerate(bodies):
        answer = _complete(server, body)
        ours = _ours(engine, [answer])
        after = _settled_exactly(server, engine, before, ours, where)
        requests.append(from_counters(engine, before, after, _generated(answer), where))
        progress(index + 1)
        before = after
    return Sent(tuple(requests), "counters")


def _cross_check(
    server: Server,
    engine: ServingEngine,
    before: Reading,
    requests: tuple[ServedRequest, ...],
    where: str,
) -> str:
    """Per-request figures must add up to the counters' movement, where only our requests
    moved them; where others' did, the per-request figures still stand (say so)."""
    assert engine.counters is not None
    ours = len(requests) if engine.counters.requests else sum(r.generated_tokens for r in requests)
    after = _settled(server, engine, before, ours)
    counted = moved(before, after, engine.counters.traffic, where)
    if counted != ours:
        return (
            f"{engine.counters.traffic} moved by {counted:g} where mtpcheck's requests account "
            f"for {ours} (others' traffic, or counters that lag): the per-request figures "
            "stand, not cross-checked with the counters"
        )
    total = from_counters(engine, before, after, 0, where)
    sums = _summed(requests)
    mine: tuple[int | None, ...] = (sums.drafts, sums.draft_tokens, sums.accepted_tokens)
    theirs: tuple[int | None, ...] = (total.drafts, total.draft_tokens, total.accepted_tokens)
    if total.drafts is None:
        mine = mine[1:]
        theirs = theirs[1:]
    if mine != theirs:
        raise ServerError(
            where,
            f"{engine.title}'s per-request figures {mine} do not add up to its counters "
            f"{theirs} (drafts, draft tokens, accepted tokens) for the same requests",
        )
    return ""


def _summed(requests: Sequence[ServedRequest]) -> ServedRequest:
    drafts = [r.drafts for r in requests]
    return ServedRequest(
        generated_tokens=sum(r.generated_tokens for r in requests),
        drafts=None if None in drafts else sum(d for d in drafts if d is not None),
        draft_tokens=sum(r.draft_tokens for r in requests),
        accepted_tokens=sum(r.accepted_tokens for r in requests),
        accepted_per_position=None,
    )
