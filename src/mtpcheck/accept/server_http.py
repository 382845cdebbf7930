"""The HTTP side of ``accept --server``: JSON requests and the ``/metrics`` page of a running
server, each bounded in time, each failure one line naming the URL (exit 2).

The standard library's ``http.client`` is enough: the servers are plain HTTP/1.1 on a known
host, and mtpcheck sends a few hundred requests, one JSON object each. It follows no redirect,
and bounds each request as a whole: in time, and in the bytes it reads.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from mtpcheck.errors import InputError, shown_text


class ServerError(InputError):
    """The server did not answer, or answered something mtpcheck cannot use (exit 2)."""


@dataclass(frozen=True)
class Server:
    """Where the server listens, and how long one request may take."""

    base: str
    """``scheme://host:port`` (with a path prefix if the server sits behind one), no slash."""
    timeout: float = 600.0

    @staticmethod
    def at(url: str, timeout: float = 600.0) -> Server:
        """``--server URL``: a trailing ``/`` or ``/v1`` (as OpenAI clients are given it) is
        dropped; only http and https are taken."""
        base = url.strip().rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        scheme = base.partition("://")[0]
        if scheme not in ("http", "https") or not base.partition("://")[2]:
            raise ServerError(url, "--server: expected an http:// or https:// URL")
        return Server(base, timeout)

    def url(self, path: str) -> str:
        """The full URL of ``path`` on the server."""
        return self.base + path

    def get_text(self, path: str) -> str:
        """The body of a GET of ``path``."""
        return self._send("GET", path)

    def get_json(self, path: str) -> Any:
        """The JSON body of a GET of ``path``."""
        return self._decode(path, self.get_text(path))

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer to ``body`` posted to ``path``."""
        return self._decode(path, self._send("POST", path, json.dumps(body).encode("utf-8")))

    def probe(self, path: str) -> Any | None:
        """GET ``path`` as JSON, or None where the server has no such page (detection asks
        every engine's pages; most servers lack most of them)."""
        try:
            return self.get_json(path)
        except ServerError:
            return None

    def _send(self, method: str, path: str, body: bytes | None = None) -> str:
        """One request, its whole answer within :attr:`timeout` (not each read: a server
        dripping a byte at a time is cut off), at most :data:`MAX_BODY_BYTES` of it; a
        redirect is refused and said (what another host answers is not this server's)."""
        url = self.url(path)
        deadline = time.monotonic() + self.timeout
        parts = urllib.parse.urlsplit(url)
        secure = parts.scheme == "https"
        kind = http.client.HTTPSConnection if secure else http.client.HTTPConnection
        conn = kind(parts.hostname or "", parts.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, target or "/", body=body, headers=headers)
            _left(conn, deadline)
            response = conn.getresponse()
            data = _body(conn, response, deadline)
        except TimeoutError as e:
            raise ServerError(url, f"no answer within {self.timeout:g} s") from e
        except _TooLong as e:
            raise ServerError(url, str(e)) from e
        except (http.client.HTTPException, OSError) as e:
            reason = getattr(e, "strerror", None) or shown_text(str(e) or type(e).__name__, 200)
            raise ServerError(url, f"no answer ({reason})") from e
        finally:
            conn.close()
        if 300 <= response.status < 400:
            moved_to = shown_text(response.getheader("Location") or "?", 200)
            raise ServerError(
                url,
                f"HTTP {response.status}: redirects to {moved_to}; mtpcheck follows no redirect "
                "(give --server the URL that answers)",
            )
        if response.status >= 400:
            raise ServerError(url, f"HTTP {response.status} {response.reason}{_said(data)}")
        return data.decode("utf-8", errors="replace")

    def _decode(self, path: str, text: str) -> Any:
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:  # ValueError: not JSON, or an int too long
            said = e.msg if isinstance(e, json.JSONDecodeError) else shown_text(str(e), 120)
            raise ServerError(self.url(path), f"answered with something not JSON ({said})") from e


MAX_BODY_BYTES = 64 << 20
"""The longest answer read: a ``/metrics`` page of many engines is a few megabytes."""


class _TooLong(Exception):
    """An answer past :data:`MAX_BODY_BYTES`."""


def _left(conn: http.client.HTTPConnection, deadline: float) -> None:
    """Give the connection's next read what is left of the request's time."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    if conn.sock is not None:
        conn.sock.settimeout(remaining)


def _body(
    conn: http.client.HTTPConnection, response: http.client.HTTPResponse, deadline: float
) -> bytes:
    """The answer's body, read a piece at a time, each read given what is left of the
    request's time."""
    pieces: list[bytes] = []
    size = 0
    while True:
        _left(conn, deadline)
        piece = response.read1(1 << 16)
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > MAX_BODY_BYTES:
            raise _TooLong(f"answered more than {MAX_BODY_BYTES} bytes")
        pieces.append(piece)


def _said(data: bytes) -> str:
    """What the server said about a refused request, on one line: OpenAI-style servers put it
    in ``{"error": {"message": ...}}`` or ``{"message": ...}``, others send plain text."""
    text = data[:65536].decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        body = text
    if isinstance(body, dict):
        inner = body.get("error", body)
        body = inner.get("message", inner) if isinstance(inner, dict) else inner
    said = " ".join(shown_text(str(body), 2000).split())
    return f": {shown_text(said)}" if said else ""
