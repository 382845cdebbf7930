"""A local stand-in for the Hugging Face Hub, for tests and benchmarks without the internet.

It speaks the endpoints huggingface_hub and mtpcheck use: ``HEAD``/``GET``
``/{repo}/resolve/{revision}/{file}`` (``X-Repo-Commit``, ``ETag`` / ``X-Linked-Etag`` with the
sha256 of LFS files, ``Content-Length``, ``Range``) and ``GET
/api/models/{repo}/revision/{revision}?blobs=true`` (commit ``sha`` and ``siblings`` with sizes
and LFS sha256).
Errors carry the ``X-Error-Code`` header the Hub sends (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``). Every request is logged with the bytes it returned; a
latency can be injected, and the next N requests of a path can be made to fail with 503.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors",)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class FakeHub:
    """Repositories served from local folders."""

    repos: dict[str, Path] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    latency: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)
    """path suffix -> how many more requests for it fail with ``failure_status``."""
    failure_status: int = 503
    log: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hash_headers_only: bool = False
    """Stand in for each file's sha256 with a hash of its header alone (benchmarks serve
    sparse files of hundreds of GB, which would take hours to hash)."""
    _hashes: dict[tuple[Path, int, int], str] = field(default_factory=dict)
    in_flight: int = 0
    """Requests being served now."""
    peak_in_flight: int = 0
    """The most requests served at once since :meth:`clear` (the client's concurrency)."""

    def add(self, repo: str, folder: Path) -> None:
        self.repos[repo] = folder

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode()).hexdigest()

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in self._hashes:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                if self.hash_headers_only:
                    head = f.read(8)
                    digest.update(head + f.read(int.from_bytes(head, "little")))
                else:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
            self._hashes[key] = digest.hexdigest()
        return self._hashes[key]

    def fetched(self, method: str | None = None) -> int:
        """Body bytes served so far (of one method, or all)."""
        return sum(r.body_bytes for r in self.log if method is None or r.method == method)

    def clear(self) -> None:
        self.log.clear()
        self.peak_in_flight = 0


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out as two writes

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _error(self, status: int, code: str, head: bool) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self._record(status, 0 if head else len(body))  # before the client can see it
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _record(self, status: int, nbytes: int) -> None:
            with hub.lock:
                hub.log.append(
                    Request(self.command, self.path, self.headers.get("Range"), status, nbytes)
                )

        def _serve(self, head: bool) -> None:
            with hub.lock:
                hub.in_flight += 1
                hub.peak_in_flight = max(hub.peak_in_flight, hub.in_flight)
            try:
                self._answer(head)
            finally:
                with hub.lock:
                    hub.in_flight -= 1

        def _answer(self, head: bool) -> None:
            if hub.latency:
                time.sleep(hub.latency)
            path = unquote(urlparse(self.path).path)
            with hub.lock:
                for suffix, left in hub.failures.items():
                    if left > 0 and path.endswith(suffix):
                        hub.failures[suffix] = left - 1
                        failing = True
                        break
                else:
                    failing = False
            if failing:
                self._error(hub.failure_status, "ServiceUnavailable", head)
                return
            if m := _INFO.match(path):
                self._info(m.group("repo"), m.group("rev"), head)
            elif m := _RESOLVE.match(path):
                self._file(m.group("repo"), m.group("rev"), m.group("file"), head)
            else:
                self._error(404, "NotFound", head)

        def _repo(self, repo: str, rev: str, head: bool) -> Path | None:
            if repo not in hub.repos:
                self._error(401, "RepoNotFound", head)
                return None
            if repo in hub.gated and "authorization" not in {k.lower() for k in self.headers}:
                self._error(403, "GatedRepo", head)
                return None
            if rev not in ("main", hub.commit(repo)):
                self._error(404, "RevisionNotFound", head)
                return None
            return hub.repos[repo]

        def _info(self, repo: str, rev: str, head: bool) -> None:
            if repo not in hub.repos:
                self._error(401, "RepoNotFound", head)
                return
            if rev not in ("main", hub.commit(repo)):
                self._error(404, "RevisionNotFound", head)
                return
            siblings = []
            for f in sorted(p for p in hub.repos[repo].iterdir() if p.is_file()):
                item: dict[str, object] = {"rfilename": f.name, "size": f.stat().st_size}
                if f.name.endswith(LFS_SUFFIXES):
                    item["lfs"] = {
                        "sha256": hub.sha256(f),
                        "size": f.stat().st_size,
                        "pointerSize": 134,
                    }
                siblings.append(item)
            info = {
                "id": repo,
                "sha": hub.commit(repo),
                "gated": "manual" if repo in hub.gated else False,
                "siblings": siblings,
            }
            body = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self._record(200, 0 if head else len(body))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _file(self, repo: str, rev: str, name: str, head: bool) -> None:
            folder = self._repo(repo, rev, head)
            if folder is None:
                return
            path = folder / name
            if not path.is_file():
                self._error(404, "EntryNotFound", head)
                return
            size = path.stat().st_size
            start, end, status = 0, size - 1, 200
            wanted = self.headers.get("Range")
            if wanted and not head:
                m = re.match(r"bytes=(\d+)-(\d*)$", wanted)
                if m is None:
                    self._error(416, "RangeNotSatisfiable", head)
                    return
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
                if start >= size:
                    self._error(416, "RangeNotSatisfiable", head)
                    return
                status = 206
            self.send_response(status)
            self.send_header("X-Repo-Commit", hub.commit(repo))
            if name.endswith(LFS_SUFFIXES):
                sha = hub.sha256(path)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("ETag", f'"{sha}"')
            else:
                git_sha = hashlib.sha1(path.read_bytes()).hexdigest()  # small files only
                self.send_header("ETag", f'"{git_sha}"')
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1))
            data = b""
            if not head:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read(end - start + 1)
            self._record(status, len(data))  # logged before the client can see the answer
            self.end_headers()
            self.wfile.write(data)

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (a time-out test) is not the server's error: say nothing on
        stderr, which the tests read."""


class HubServer:
    """``with HubServer(hub) as url:`` serves ``hub`` on a free loopback port."""

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        self.server = _Server(("127.0.0.1", 0), _handler(hub))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
