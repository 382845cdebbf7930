"""The HTTP side of ``accept --server``: JSON requests and the ``/metrics`` page of a running
server, each bounded in time, each failure one line naming the URL (exit 2).

The standard library's ``urllib`` is enough: the servers are plain HTTP/1.1 on a known host,
and mtpcheck sends a few hundred requests, one JSON object each.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from mtpcheck.errors import InputError


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
        return self._send(urllib.request.Request(self.url(path), method="GET"))

    def get_json(self, path: str) -> Any:
        """The JSON body of a GET of ``path``."""
        return self._decode(path, self.get_text(path))

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON answer to ``body`` posted to ``path``."""
        request = urllib.request.Request(
            self.url(path),
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        return self._decode(path, self._send(request))

    def probe(self, path: str) -> Any | None:
        """GET ``path`` as JSON, or None where the server has no such page (detection asks
        every engine's pages; most servers lack most of them)."""
        try:
            return self.get_json(path)
        except ServerError:
            return None

    def _send(self, request: urllib.request.Request) -> str:
        url = request.full_url
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text: str = response.read().decode("utf-8", errors="replace")
                return text
        except urllib.error.HTTPError as e:
            raise ServerError(url, f"HTTP {e.code} {e.reason}{_said(e)}") from e
        except urllib.error.URLError as e:
            reason = getattr(e.reason, "strerror", None) or str(e.reason)
            raise ServerError(url, f"no answer ({reason})") from e
        except TimeoutError as e:
            raise ServerError(url, f"no answer within {self.timeout:g} s") from e
        except (ConnectionError, OSError) as e:
            raise ServerError(url, f"connection failed ({e.strerror or e})") from e

    def _decode(self, path: str, text: str) -> Any:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ServerError(self.url(path), f"answered with something not JSON ({e.msg})") from e


def _said(error: urllib.error.HTTPError) -> str:
    """What the server said about a refused request, on one line: OpenAI-style servers put it
    in ``{"error": {"message": ...}}`` or ``{"message": ...}``, others send plain text."""
    try:
        text = error.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        body = text
    if isinstance(body, dict):
        inner = body.get("error", body)
        body = inner.get("message", inner) if isinstance(inner, dict) else inner
    said = " ".join(str(body).split())
    if len(said) > 300:
        said = said[:297] + "..."
    return f": {said}" if said else ""
