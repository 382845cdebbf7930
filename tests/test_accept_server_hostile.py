"""``accept --server`` against a server that misbehaves as an adversary would, on loopback:
each answer mtpcheck cannot use is one line naming the URL (exit 2), never an internal error;
every request is bounded as a whole in time and in the bytes read; redirects are not followed.

The answers of another shape are the recorded vLLM 0.32 answers (``tests/recorded_server.py``)
with one field changed; the HTTP-level behaviour comes from a small handler of its own. Every
server listens on 127.0.0.1 and is stopped by its ``with`` block.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from mtpcheck.accept import server_http
from tests.recorded_server import Script, replaying
from tests.recorded_server import serving as serving_handler
from tests.test_accept_server_replay import VLLM, _accept, _error, _vllm_script, one_prompt

__all__ = ["one_prompt"]  # the workload fixture, shared with the replay tests


# --- answers of another shape ----------------------------------------------------------------


def _with_completion(change: Callable[[dict[str, Any]], None]) -> Script:
    script = _vllm_script()
    answer = copy.deepcopy(script.completions[0])
    change(answer)
    script.completions = [answer]
    return script


def _spec(answer: dict[str, Any]) -> dict[str, Any]:
    return answer["metrics"]["speculative_decoding"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda a: a["usage"].update(completion_tokens="ten"),
            "/v1/completions: usage.completion_tokens is 'ten', not a count",
        ),
        (
            lambda a: _spec(a).pop("acceptance_histogram"),
            "/v1/completions: vLLM answered without acceptance_histogram",
        ),
        (
            lambda a: _spec(a).update(num_draft_tokens=-3),
            "/v1/completions: vLLM metrics.speculative_decoding.num_draft_tokens is -3, not a "
            "count",
        ),
        (
            lambda a: _spec(a).update(acceptance_histogram={"0": 1}),
            "/v1/completions: vLLM metrics.speculative_decoding.acceptance_histogram is "
            "{'0': 1}, not a list of counts",
        ),
    ],
)
def test_a_completion_of_another_shape_is_one_line(
    change: Callable[[dict[str, Any]], None], reason: str, run_cli, one_prompt: Path
) -> None:
    with replaying(_with_completion(change)) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run) == f"mtpcheck: error: {url}{reason}"


def test_a_model_list_of_another_shape_is_one_line(run_cli, one_prompt: Path) -> None:
    script = _vllm_script()
    script.pages["/v1/models"] = {"data": 5}
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run) == (
        f"mtpcheck: error: {url}/v1/models: lists no model; name one with --server-model"
    )


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (  # a counter that is no number
            lambda page: (
                page + 'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} NaN\n'
            ),
            "vllm:spec_decode_num_draft_tokens_total is nan, not a count",
        ),
        (  # a draft position that is no number
            lambda page: page.replace('position="0"', 'position="first"'),
            "vllm:spec_decode_num_accepted_tokens_per_pos_total has a position label 'first', "
            "not a number",
        ),
        (  # no exposition text at all
            lambda page: "{{{ not metrics",
            "not Prometheus exposition text",
        ),
    ],
)
def test_a_metrics_page_of_another_shape_is_one_line(
    edit: Callable[[str], str], reason: str, run_cli, one_prompt: Path
) -> None:
    script = _vllm_script()
    script.metrics = [edit(page) for page in script.metrics]
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--concurrency", "1")
    assert run.exit_code == 2, run
    line = _error(run)
    assert line.startswith(f"mtpcheck: error: {url}/metrics") and reason in line, line


def test_json_nested_past_the_parser_is_one_line(run_cli, one_prompt: Path) -> None:
    with serving({"/v1/models": (200, b"[" * 100_000 + b"]" * 100_000)}) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run).startswith(
        f"mtpcheck: error: {url}/v1/models: answered with something not JSON"
    )


# --- HTTP: redirects, endless bodies, slow servers -------------------------------------------


@contextmanager
def serving(
    raw: dict[str, tuple[int, bytes] | Callable[[BaseHTTPRequestHandler], None]],
    base: Script | None = None,
) -> Iterator[str]:
    """A loopback server answering ``raw[path]`` (a status and body, or a handler of its own),
    and for other paths what ``base`` (the recorded vLLM server) answers; always stopped."""
    with replaying(base or _vllm_script()) as recorded:

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                answer = raw.get(self.path)
                if answer is None:
                    self._forward()
                elif callable(answer):
                    answer(self)
                else:
                    code, body = answer
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            do_POST = do_GET

            def _forward(self) -> None:
                import urllib.request

                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                request = urllib.request.Request(recorded + self.path, data=data)
                request.add_header("Content-Type", "application/json")
                with urllib.request.urlopen(request, timeout=10) as r:
                    body = r.read()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        with serving_handler(Handler) as url:
            yield url


def _redirect(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(302)
    handler.send_header("Location", "http://127.0.0.2:9/metrics")
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def test_a_redirect_is_refused_and_said(run_cli, one_prompt: Path) -> None:
    """What another host answers is not the named server's."""
    with serving({"/metrics": _redirect}) as url:
        run = _accept(run_cli, url, one_prompt, "--server-engine", "vllm")
    assert run.exit_code == 2, run
    assert (
        f"{url}/metrics: HTTP 302: redirects to http://127.0.0.2:9/metrics; mtpcheck follows no "
        "redirect (give --server the URL that answers)"
    ) in _error(run)


def test_an_answer_past_the_cap_is_refused_unread(
    run_cli, one_prompt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap = max(len(page.encode()) for page in VLLM["mtp_k1"]["metrics"]) + 100
    monkeypatch.setattr(server_http, "MAX_BODY_BYTES", cap)  # the real pages fit, this does not
    with serving({"/v1/completions": (200, b" " * (cap + 1))}) as url:
        run = _accept(run_cli, url, one_prompt, "--server-engine", "vllm")
    assert run.exit_code == 2, run
    assert _error(run) == (f"mtpcheck: error: {url}/v1/completions: answered more than {cap} bytes")


def _drip(handler: BaseHTTPRequestHandler) -> None:
    """Headers, then a byte every 0.2 s for 10 s: every read answers within any timeout."""
    handler.send_response(200)
    handler.send_header("Content-Length", "50")
    handler.end_headers()
    for _ in range(50):
        try:
            handler.wfile.write(b" ")
            handler.wfile.flush()
        except OSError:
            return
        time.sleep(0.2)


def test_a_server_dripping_its_answer_is_cut_off_at_the_request_timeout(
    run_cli, one_prompt: Path
) -> None:
    """``--request-timeout`` bounded each socket read, so a byte a second held a 5 s request
    for 90 s; it bounds the request now."""
    with serving({"/metrics": _drip}) as url:
        start = time.monotonic()
        run = _accept(run_cli, url, one_prompt, "--server-engine", "vllm", "--request-timeout", "1")
        took = time.monotonic() - start
    assert run.exit_code == 2, run
    assert f"{url}/metrics: no answer within 1 s" in _error(run)
    assert took < 8, took  # not the drip's 10 s (a bound on the harness, not a timing claim)
