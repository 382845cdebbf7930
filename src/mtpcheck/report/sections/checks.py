"""The checks: every finding, and the verdict they make."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from mtpcheck.errors import one_line
from mtpcheck.model import CheckResult, Finding, Report, Status
from mtpcheck.report.blocks import Block, Cell, CellLike, Column, Grid, Line
from mtpcheck.report.formatting import md_cell, md_table
from mtpcheck.report.section import Section

STYLE = {
    Status.PASS: "green",
    Status.FAIL: "bold red",
    Status.WARN: "yellow",
    Status.SKIP: "dim",
    Status.INFO: "cyan",
}
"""Terminal style of each status."""
ICON = {
    Status.PASS: "✅",
    Status.FAIL: "❌",
    Status.WARN: "⚠️",
    Status.SKIP: "⏭️",
    Status.INFO: "ℹ️",
}
"""Markdown icon of each status."""
MAX_ROWS_PER_CHECK = 25
"""Terminal: findings shown per check; the JSON report has them all."""
MIN_FINDING = 40
"""Terminal: the narrowest the findings column gets, in characters."""


NO_FINDINGS = "no findings"


def findings_of(check: CheckResult) -> tuple[Finding, ...]:
    """A check's findings as every format shows them: a check that found nothing shows one
    SKIP saying so (the JSON schema holds each check to a finding at least)."""
    return check.findings or (Finding("-", Status.SKIP, NO_FINDINGS),)


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """``text`` with the characters XML 1.0 cannot hold (most control characters, lone
    surrogates) written as ``\\xNN`` / ``\\uNNNN`` escapes, so the report stays well-formed."""
    return _NOT_XML.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def _longest(report: Report) -> tuple[int, int]:
    """Longest subject, and longest unbreakable word of a finding (a tensor name)."""
    subject, word = 7, 7
    for check in report.checks:
        for f in findings_of(check)[:MAX_ROWS_PER_CHECK]:
            subject = max(subject, len(f.subject))
            word = max(word, *(len(w) for w in f.message.split()), 0)
    return subject, min(max(word, MIN_FINDING), 400)


def needed_width(report: Report) -> int:
    """Terminal width at which the checks table splits no name across lines."""
    checks = max((len(c.label) for c in report.checks), default=5)
    subject, word = _longest(report)
    return len("status") + checks + subject + word + 3 * 2


def _rows(check: CheckResult) -> list[tuple[CellLike, ...]]:
    shown = findings_of(check)[:MAX_ROWS_PER_CHECK]
    rows: list[tuple[CellLike, ...]] = [
        (Cell(f.status.value.upper(), STYLE[f.status]), check.label, f.subject, f.message)
        for f in shown
    ]
    hidden = len(findings_of(check)) - len(shown)
    if hidden:
        rows.append(("", check.label, "", f"... {hidden} more (use --format json)"))
    return rows


def _table(report: Report) -> tuple[Block, ...]:
    subject_width, word_width = _longest(report)
    # a tensor name is never split across lines: the subject column is as wide as the
    # longest subject, and findings wrap only at spaces
    columns = (
        Column("status"),
        Column("check"),
        Column("subject", min_width=subject_width),
        Column("finding", no_wrap=False, min_width=word_width, overflow="fold", ratio=1),
    )
    rows = tuple(row for check in report.checks for row in _rows(check))
    strict = " under --strict" if report.strict and report.failing else ""
    verdict = (
        Cell("PASS", "bold green")
        if report.ok
        else Cell(f"FAIL ({one_line(', '.join(report.failing))}){strict}", "bold red")
    )
    return (Grid(None, columns, rows), Line((Cell("verdict: "), verdict)))


def _markdown(report: Report) -> str:
    rows = (
        (ICON[f.status], check.label, f"`{md_cell(f.subject)}`", md_cell(f.message))
        for check in report.checks
        for f in findings_of(check)
    )
    return md_table("\n", (None, "check", "subject", "finding"), rows)


def _check_json(c: CheckResult) -> dict[str, Any]:
    findings = [
        {
            "subject": f.subject,
            "status": f.status.value,
            "message": f.message,
            "details": dict(f.details),
        }
        for f in findings_of(c)
    ]
    return {"name": c.label, "title": c.title, "status": c.status.value, "findings": findings}


def _json(report: Report) -> dict[str, Any]:
    return {"checks": [_check_json(c) for c in report.checks]}


def _testcase(report: Report, check: CheckResult) -> ET.Element:
    """One check as a test: failed (or warned under ``--strict``), skipped, or passed with its
    findings as output."""
    name = xml_text(check.label)
    case = ET.Element("testcase", classname=f"mtpcheck.{report.command}", name=name)
    findings = findings_of(check)
    lines = xml_text("\n".join(f"[{f.status.value}] {f.subject}: {f.message}" for f in findings))
    if report.fails(check):  # failed, or warned under --strict
        first = next(f for f in findings if f.status is check.status)
        message = xml_text(f"{first.subject}: {first.message}")
        ET.SubElement(case, "failure", message=message).text = lines
    elif check.status is Status.SKIP:
        ET.SubElement(case, "skipped", message=xml_text(findings[0].message))
    else:
        ET.SubElement(case, "system-out").text = lines
    case.set("file", xml_text(", ".join(s.path for s in report.inputs)))
    return case


def _junit(report: Report) -> tuple[ET.Element, ...]:
    return tuple(_testcase(report, check) for check in report.checks)


SECTION = Section("checks", _table, _markdown, _json, _junit)
"""The checks section: last on the terminal and in Markdown, the tests of JUnit XML."""
