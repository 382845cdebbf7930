"""Run a user's converter command: bounded time, process group killed on timeout or Ctrl-C."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

TAIL_LINES = 15
LINE_CHARS = 400


@dataclass(frozen=True)
class CommandResult:
    ok: bool
    message: str
    stderr_tail: str
    seconds: float


def validate_template(template: str) -> None:
    """A converter template must name both ``{src}`` and ``{dst}``."""
    missing = [p for p in ("{src}", "{dst}") if p not in template]
    if missing:
        raise ValueError(f"converter command {template!r} lacks {' and '.join(missing)}")


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
    proc.communicate()


def run_command(template: str, src: Path, dst: Path, timeout: float | None) -> CommandResult:
    """Run ``template`` with ``{src}``/``{dst}`` substituted (shell-quoted) in a shell."""
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
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return CommandResult(False, f"timed out after {timeout:g} s", "", time.monotonic() - start)
    except BaseException:
        _kill(proc)
        raise
    seconds = time.monotonic() - start
    tail = _tail(err or out)
    if proc.returncode != 0:
        return CommandResult(False, f"exited with status {proc.returncode}", tail, seconds)
    if not dst.exists() or (dst.is_dir() and not any(dst.iterdir())):
        return CommandResult(False, f"exited 0 but wrote nothing to {dst}", tail, seconds)
    return CommandResult(True, f"finished in {seconds:.1f} s", tail, seconds)
