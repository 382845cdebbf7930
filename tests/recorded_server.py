"""A loopback HTTP server that replays what a real engine's server answered (recorded by
``tests/thirdparty/vllm/server/record.py`` and kept in ``tests/data/served/``), with the
misbehaviour a test asks for: counters that reset, another client's requests, refused
token-id prompts. For the failure paths no real engine can be made to walk on cue; every
figure a verdict is asserted on comes from the real servers (``tests/test_accept_server.py``).

Listens on 127.0.0.1 on a free port, in a daemon thread; ``with replaying(...) as url:``
always stops it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Script:
    """What the replayed server answers."""

    metrics: list[str]
    """Metrics pages: ``metrics[page]`` is served; each completion moves ``page`` on by one
    (the last one stays)."""
    completions: list[dict[str, Any]] = field(default_factory=list)
    """``/v1/completions`` answers in order; the last one repeats."""
    pages: dict[str, Any] = field(default_factory=dict)
    """Other GET pages (``/version``, ``/v1/models``) as JSON."""
    refuse_token_ids: dict[str, Any] | None = None
    """Answer a token-id prompt with HTTP 400 and this JSON body."""
    metrics_path: str = "/metrics"
    page: int = 0
    posts: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """Every completion request received, in order."""


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep the test's output clean
            pass

        def _send(self, code: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with lock:
                if self.path == script.metrics_path:
                    page = script.metrics[min(script.page, len(script.metrics) - 1)]
                    self._send(200, page, "text/plain; version=0.0.4")
                elif self.path in script.pages:
                    self._send(200, json.dumps(script.pages[self.path]))
                else:
                    self._send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                script.bodies.append(body)
                if script.refuse_token_ids and isinstance(body.get("prompt"), list):
                    self._send(400, json.dumps(script.refuse_token_ids))
                    return
                answer = script.completions[min(script.posts, len(script.completions) - 1)]
                script.posts += 1
                script.page += 1
            self._send(200, json.dumps(answer))

    return Handler


@contextmanager
def replaying(script: Script) -> Iterator[str]:
    """Serve ``script`` on 127.0.0.1; yields the base URL; always shuts the server down."""
    with serving(_handler(script)) as url:
        yield url


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 in a daemon thread; yields the base URL; always shuts
    the server down."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
