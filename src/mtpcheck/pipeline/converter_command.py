"""Run a user's converter command: bounded time, process group killed on timeout or Ctrl-C."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TAIL_LINES = 15
LINE_CHARS = 400


@dataclass(frozen=True)
class CommandResult:
    """How one conversion (the user's command or the built-in one) ended."""

    ok: bool
    message: str
    stderr_tail: str
    seconds: float


def _tail(data: bytes) -> str:
    """The last lines of a converter's output, each cut to a readable length (a library may
    print a whole config object on one line)."""
    lines = data.decode("utf-8", errors="replace").rstrip().splitlines()
    return "\n".join(_shorten(line) for line in lines[-TAIL_LINES:])


def _shorten(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[: LINE_CHARS - 40]} ... [{len(line) - LINE_CHARS + 40} more characters]"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _pump(stream: IO[bytes], keep: deque[bytes], on_line: Callable[[str], None] | None) -> None:
    """Read ``stream`` to its end, keeping the last lines and passing each one on."""
    for raw in iter(stream.readline, b""):
        keep.append(raw)
        if on_line is not None:
            on_line(_shorten(raw.decode("utf-8", errors="replace").rstrip()))
    stream.close()


def run_command(
    template: str,
    src: Path,
    dst: Path,
    timeout: float | None,
    on_line: Callable[[str], None] | None = None,
) -> CommandResult:
    """Run ``template`` with ``{src}``/``{dst}`` substituted (shell-quoted) in a shell.

    Each line the command writes to stderr is passed to ``on_line`` as it comes (a long
    conversion is not silent); the last lines of stderr (else stdout) end up in the result.
    """
    command = template.format(src=shlex.quote(str(src)), dst=shlex.quote(str(dst)))
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        shell=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out: deque[bytes] = deque(maxlen=TAIL_LINES)
    err: deque[bytes] = deque(maxlen=TAIL_LINES)
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, None), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err, on_line), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return CommandResult(False, f"timed out after {timeout:g} s", "", time.monotonic() - start)
    except BaseException:
        _kill(proc)
        raise
    for pump in pumps:
        pump.join(timeout=5)  # a grandchild may hold the pipe open; do not wait on it forever
    seconds = time.monotonic() - start
    tail = _tail(b"".join(err) or b"".join(out))
    if proc.returncode != 0:
        return CommandResult(False, f"exited with status {proc.returncode}", tail, seconds)
    if not dst.exists() or (dst.is_dir() and not any(dst.iterdir())):
        return CommandResult(False, f"exited 0 but wrote nothing to {dst}", tail, seconds)
    return CommandResult(True, f"finished in {seconds:.1f} s", tail, seconds)
