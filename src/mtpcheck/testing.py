"""Assertions for a converter's own test suite: "the MTP layers survive" in one line.

    from mtpcheck.testing import assert_mtp_intact, assert_mtp_preserved

    def test_conversion_keeps_mtp(tmp_path):
        convert(SOURCE, tmp_path / "out")
        assert_mtp_intact(tmp_path / "out")
        assert_mtp_preserved(SOURCE, tmp_path / "out")

Each raises :class:`AssertionError` whose message lists the report's failing findings, so a
test runner shows what broke; the report is returned when nothing failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpcheck.api import diff, inspect, roundtrip
from mtpcheck.model import Report, Status


def failing_findings(report: Report) -> list[str]:
    """Every failing finding of ``report``, one line each: ``check: subject: message``."""
    return [
        f"{check.name}: {finding.subject}: {finding.message}"
        for check in report.checks
        for finding in check.findings
        if finding.status is Status.FAIL
    ]


def assert_no_findings(report: Report) -> Report:
    """Fail (``AssertionError``) unless ``report`` passes, naming each failing finding."""
    failing = failing_findings(report)
    if failing or not report.ok:
        inputs = ", ".join(i.path for i in report.inputs) or "no input"
        lines = "\n".join(f"  - {line}" for line in failing)
        raise AssertionError(
            f"mtpcheck {report.command} ({inputs}): {len(failing)} failing finding(s)\n{lines}"
        )
    return report


def assert_mtp_intact(path: str | Path, **options: Any) -> Report:
    """The checkpoint at ``path`` declares its MTP layers and holds them whole
    (:func:`mtpcheck.api.inspect` passes; ``options`` are its keywords)."""
    return assert_no_findings(inspect(path, **options))


def assert_mtp_preserved(source: str | Path, converted: str | Path, **options: Any) -> Report:
    """``converted`` holds ``source``'s MTP layers bit for bit, in either format
    (:func:`mtpcheck.api.diff` passes; ``options`` are its keywords, e.g. ``all_tensors``)."""
    return assert_no_findings(diff(source, converted, **options))


def assert_roundtrip(path: str | Path, **options: Any) -> Report:
    """HF -> Megatron -> HF keeps the MTP layers (:func:`mtpcheck.api.roundtrip` passes;
    ``options`` are its keywords, e.g. your converters as ``to_megatron`` and ``to_hf``)."""
    return assert_no_findings(roundtrip(path, **options))


__all__ = [
    "assert_mtp_intact",
    "assert_mtp_preserved",
    "assert_no_findings",
    "assert_roundtrip",
    "failing_findings",
]
