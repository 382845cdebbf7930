"""Progress on a terminal is a live bar on stderr; the report on stdout is unchanged by it."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys

from rich.console import Console

from mtpcheck.cli.stderr_log import StderrLog
from mtpcheck.ticker import Ticker
from tests.conftest import FIXTURES
from tests.launch import child_env

MiB = 2**20


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=160, highlight=False), out


def test_a_terminal_gets_a_bar_with_bytes_and_the_tensor_then_the_closing_line() -> None:
    console, out = _console(terminal=True)
    sink = StderrLog(console=console)
    now = [0.0]
    ticker = Ticker("comparing", 4 * MiB, sink, interval=5.0, clock=lambda: now[0])
    assert ticker.bar is not None
    ticker.advance(MiB, "model.layers.2.eh_proj.weight")
    sink("stage 1 converter | writing shard 1")  # printed above the bar
    now[0] = 8.0
    ticker.advance(3 * MiB, "model.layers.2.enorm.weight")
    ticker.finish("2 tensors")
    text = out.getvalue()
    assert "\x1b[" in text  # drawn in place, not as lines
    assert "mtpcheck: comparing" in text and "/4.0 MiB" in text
    assert "model.layers.2.enorm.weight" in text  # where the work is (redrawn ~10 times/s)
    assert "mtpcheck: stage 1 converter | writing shard 1\n" in text
    assert text.rstrip().endswith("mtpcheck: comparing: 2 tensors, 4.00 MiB in 8 s (512.00 KiB/s)")
    assert sink.bar is None  # the next long step gets a bar of its own


def test_without_a_terminal_the_same_ticker_prints_plain_lines() -> None:
    console, out = _console(terminal=False)
    sink = StderrLog(console=console)
    now = [0.0]
    ticker = Ticker("comparing", 4 * MiB, sink, interval=5.0, clock=lambda: now[0])
    assert ticker.bar is None
    now[0] = 6.0
    ticker.advance(MiB, "t0")
    ticker.finish("1 tensor")
    assert out.getvalue().splitlines() == [
        "mtpcheck: comparing: 1.00 MiB of 4.00 MiB (25%), 170.67 KiB/s, about 18 s left, at t0",
        "mtpcheck: comparing: 1 tensor, 4.00 MiB in 6 s (682.67 KiB/s)",
    ]


def test_quiet_draws_nothing_even_on_a_terminal() -> None:
    console, out = _console(terminal=True)
    sink = StderrLog(quiet=True, console=console)
    ticker = Ticker("comparing", MiB, sink, interval=0.0)
    ticker.advance(MiB, "t0")
    ticker.finish("1 tensor")
    sink("a line")
    assert ticker.bar is None and out.getvalue() == ""


def _on_a_terminal(*args: str) -> tuple[int, str, bytes]:
    """mtpcheck with stderr on a pseudo-terminal and stdout on a pipe."""
    main, sub = pty.openpty()
    env = {**child_env(), "TERM": "xterm", "COLUMNS": "160"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtpcheck", *args], stdout=subprocess.PIPE, stderr=sub, env=env
    )
    os.close(sub)
    err = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    os.close(main)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=60), out, err


def test_a_real_run_on_a_terminal_draws_a_bar_and_keeps_stdout_clean() -> None:
    args = ["diff", str(FIXTURES / "deepseek_v3"), str(FIXTURES / "deepseek_v3"), "--all"]
    piped = subprocess.run(
        [sys.executable, "-m", "mtpcheck", *args, "--format", "json"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    code, out, err = _on_a_terminal(*args, "--format", "json")
    assert code == 0 == piped.returncode
    assert json.loads(out) == json.loads(piped.stdout)  # the bar never reaches stdout
    assert b"mtpcheck: comparing" in err and b"\x1b[" in err
    assert b"model.norm.weight" in err  # the last tensor compared, shown on the bar
    assert piped.stderr == ""  # piped, a run this short prints no line at all
    code, out, err = _on_a_terminal(*args, "--format", "json", "--quiet")
    assert code == 0 and err == b"" and json.loads(out) == json.loads(piped.stdout)
