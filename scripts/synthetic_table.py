#!/usr/bin/env python3
"""Measure ``mtpcheck roundtrip CONFIG --synthetic`` on every published config the repository
keeps (src/mtpcheck/families/published) and write the table into docs/commands/roundtrip.md.

    .venv/bin/python scripts/synthetic_table.py           # measure, rewrite the table
    .venv/bin/python scripts/synthetic_table.py --check   # measure, print, change nothing

Each config runs in a process of its own (``python -m mtpcheck``), one after another; its wall
time and peak resident memory (``wait4``'s ``ru_maxrss``) are its own, interpreter start and
imports included. The outcome column is what tests/test_synthetic_published.py asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "src" / "mtpcheck" / "families" / "published"
PAGE = ROOT / "docs" / "commands" / "roundtrip.md"
START, END = "<!-- synthetic-table -->", "<!-- /synthetic-table -->"


def measure(config: Path) -> tuple[tuple[str, str], float, float]:
    """(outcome, seconds, peak MiB) of one synthetic round trip."""
    with tempfile.TemporaryDirectory() as work:
        argv = [sys.executable, "-m", "mtpcheck", "roundtrip", str(config.relative_to(ROOT))]
        argv += ["--synthetic", "--format", "json", "--quiet", "--workdir", work]
        out, err = Path(work, "stdout"), Path(work, "stderr")
        start = time.monotonic()
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=stderr)
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not the largest
        seconds = time.monotonic() - start
        code = os.waitstatus_to_exitcode(status)
        outcome = _outcome(code, out.read_text(), err.read_text())
    return outcome, seconds, usage.ru_maxrss / 1024  # Linux: KiB


def _outcome(code: int, out: str, err: str) -> tuple[str, str]:
    """The outcome in a few words, and the converter a refusal names (empty where none)."""
    if code == 0:
        return "PASS", ""
    if code == 1:
        report = json.loads(out)
        failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
        return f"FAIL ({', '.join(failed)})", ""
    line = err.strip().splitlines()[-1] if err.strip() else ""
    if code != 2 or ": " not in line:
        return f"exit {code}: {line}", ""
    reason = line.split(": ", 3)[-1]  # past "mtpcheck: error: PATH: "
    named = re.search(r"[^;:]*'s \w+[^;:]* converts it \([^)]*\)", reason)
    return f"refused: {reason.split(': ', 1)[0]}", named.group(0).strip() if named else ""


def table() -> str:
    rows = [
        "| config | outcome | converter the refusal names | time | peak memory |",
        "|---|---|---|---|---|",
    ]
    for config in sorted(CONFIGS.glob("*.json")):
        (outcome, named), seconds, mib = measure(config)
        rows.append(
            f"| `{config.stem}` | {outcome} | {named or '-'} | {seconds:.1f} s | {mib:.0f} MiB |"
        )
        print(rows[-1], file=sys.stderr)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print the table, write nothing")
    made = table()
    if parser.parse_args().check:
        print(made)
        return
    page = PAGE.read_text()
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{START}\n{made}\n{END}{tail}")


if __name__ == "__main__":
    main()
