"""A user's converter command: its output tail stays readable in a report."""

from __future__ import annotations

import sys
from pathlib import Path

from mtpcheck.pipeline.converter_command import LINE_CHARS, TAIL_LINES, run_command


def test_failure_tail_keeps_the_last_lines_and_cuts_long_ones(tmp_path: Path) -> None:
    long = "ValueError: Invalid spec: Config(" + "x=1, " * 2000 + ")"  # a library's repr
    script = tmp_path / "convert.py"
    script.write_text(
        "import sys\n"
        "for i in range(30):\n"
        "    print(f'line {i}', file=sys.stderr)\n"
        f"print({long!r}, file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    result = run_command(f"{sys.executable} {script} {{src}} {{dst}}", tmp_path, tmp_path / "o", 60)
    assert not result.ok and result.message == "exited with status 3"
    lines = result.stderr_tail.splitlines()
    assert len(lines) == TAIL_LINES and lines[0] == "line 16"
    assert lines[-1].startswith("ValueError: Invalid spec: Config(x=1, ")
    assert lines[-1].endswith(f" ... [{len(long) - LINE_CHARS + 40} more characters]")
    assert len(lines[-1]) < LINE_CHARS + 40
