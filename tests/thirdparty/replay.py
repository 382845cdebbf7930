"""Replaying a third-party tool's recorded HF -> Megatron -> HF output through ``roundtrip``,
and reading the failing findings of a JSON report: shared by the corpus tests
(``tests/test_thirdparty_megatron_bridge_062.py``, ``tests/test_thirdparty_mcore_bridge.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES


def source_of(case: str) -> Path:
    """The shipped fixture a corpus case was converted from (``-mtp1``: with the MTP count)."""
    return FIXTURES / case.removesuffix("-mtp1")


def replay_roundtrip(
    run_cli: Callable[..., Any], corpus: Path, case: str, tmp_path: Path, *extra: str
) -> dict[str, Any]:
    """``roundtrip`` of the case's fixture whose converter commands copy the tool's recorded
    ``corpus/case/megatron`` and ``hf`` output into place; the JSON report."""
    tool = corpus / case
    run = run_cli(
        "roundtrip", source_of(case), "--workdir", tmp_path, "--format", "json", *extra,
        "--to-megatron", f"cp -r {tool / 'megatron'} {{dst}}  # replays {{src}}",
        "--to-hf", f"cp -r {tool / 'hf'} {{dst}}  # replays {{src}}",
    )  # fmt: skip
    report = json.loads(run.stdout)
    assert run.exit_code == (0 if report["ok"] else 1), run
    return report


def failing_checks(report: dict[str, Any]) -> dict[str, list[str]]:
    """Failing check -> the subjects of its failing findings."""
    return {
        c["name"]: [f["subject"] for f in c["findings"] if f["status"] == "fail"]
        for c in report["checks"]
        if c["status"] == "fail"
    }


def fail_messages(report: dict[str, Any], check: str, status: str = "fail") -> dict[str, str]:
    """Subject -> message of the failing findings of ``check`` (or those of ``status``)."""
    return {
        f["subject"]: f["message"]
        for c in report["checks"]
        if c["name"] == check
        for f in c["findings"]
        if f["status"] == status
    }
