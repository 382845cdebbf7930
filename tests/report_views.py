"""Reading a JSON report in tests: the report of a CLI run, one check's findings, the failing
ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def report_of(run_cli: Any, *args: str | Path) -> tuple[int, dict[str, Any]]:
    """(exit code, JSON report) of ``mtpcheck ARGS --format json``."""
    run = run_cli(*args, "--format", "json")
    return run.exit_code, json.loads(run.stdout)


def findings_of(report: dict[str, Any], check: str) -> list[tuple[str, str, str]]:
    """(status, subject, message) of every finding of the check named ``check``."""
    found = next(c for c in report["checks"] if c["name"] == check)
    return [(f["status"], f["subject"], f["message"]) for f in found["findings"]]


def failing_of(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(check, subject, message) of every failing finding, in report order."""
    return [
        (c["name"], f["subject"], f["message"])
        for c in report["checks"]
        for f in c["findings"]
        if f["status"] == "fail"
    ]
