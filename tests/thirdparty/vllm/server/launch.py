"""Start and stop vLLM's OpenAI server on a fixture, for the tests (standard library only).

Each server is ``serve.py`` (the harness patches in every process of the server) in vLLM's
venv, in a session of its own on 127.0.0.1 and a free port; :func:`ready` waits for its
``/health`` at most ``timeout`` seconds, and :func:`stop` ends the whole process group
(TERM, then KILL), so that no engine-core process outlives a test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Launched:
    url: str
    process: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    venv: Path,
    fixture: Path,
    k: int,
    work: Path,
    skip: tuple[str, ...] = (),
    port: int | None = None,
) -> Launched:
    """``serve.py FIXTURE --draft-tokens K`` (k = 0: no speculative decoding), on ``port`` or
    a free one."""
    work.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [str(venv / "bin" / "python"), str(HERE / "serve.py"), str(fixture),
            "--draft-tokens", str(k), "--port", str(port), "--work-dir", str(work)]  # fmt: skip
    for name in skip:
        argv += ["--skip-patch", name]
    log = work / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Launched(f"http://127.0.0.1:{port}", process, log)


def ready(server: Launched, timeout: float = 300.0) -> None:
    """Wait for ``/health``; raise with the log's tail if the server dies or takes longer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"vLLM server exited: {tail(server.log)}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM server not ready in {timeout:g} s: {tail(server.log)}")


def stop(server: Launched) -> None:
    """TERM the server's process group, KILL what is left after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.process.wait(timeout=wait)
            # the group may hold the engine core still: give it the same chance
            os.killpg(server.process.pid, 0)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def tail(log: Path, lines: int = 25) -> str:
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])
