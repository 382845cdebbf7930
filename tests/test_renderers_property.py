"""Every renderer takes every report the model allows: property tests over generated reports
(checks with no findings or many, every status, every check name of the registry and
``acceptance/WORKLOAD`` ones, messages of any text, ``--strict`` or not). A renderer that raised
on one (JUnit's on a check without findings did) would turn a finished run into an internal
error after its work was done."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpcheck.model import CheckName, CheckResult, Finding, Report, Status
from mtpcheck.report import renderer
from tests.conftest import check_report_schema

TEXT = st.text(max_size=40)
FINDINGS = st.builds(
    Finding,
    subject=TEXT,
    status=st.sampled_from(Status),
    message=st.text(max_size=200),
    details=st.dictionaries(st.text(max_size=8), st.integers() | TEXT, max_size=3),
)
NAMED = st.builds(
    CheckResult,
    name=st.sampled_from([n for n in CheckName if n is not CheckName.ACCEPTANCE]),
    title=TEXT,
    findings=st.lists(FINDINGS, max_size=5).map(tuple),
)
WORKLOADS = st.builds(  # accept's: one check per workload, named acceptance/WORKLOAD
    CheckResult,
    name=st.just(CheckName.ACCEPTANCE),
    title=TEXT,
    findings=st.lists(FINDINGS, max_size=5).map(tuple),
    workload=st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True),
)
CHECKS = NAMED | WORKLOADS
REPORTS = st.builds(
    Report,
    command=st.sampled_from(["inspect", "diff", "roundtrip", "accept"]),
    inputs=st.just(()),
    checks=st.lists(CHECKS, max_size=6).map(tuple),
    strict=st.booleans(),
)


def _render(kind: str, report: Report) -> str:
    out = io.StringIO()
    renderer(kind).render(report, out)
    return out.getvalue()


@settings(max_examples=100, deadline=None)
@given(REPORTS)
def test_every_renderer_renders_every_report(report: Report) -> None:
    table = _render("table", report)  # the verdict last (long check names wrap it)
    verdict = table.rpartition("verdict: ")[2]
    assert verdict.startswith("PASS" if report.ok else "FAIL ("), table
    check_report_schema(_render("json", report))
    assert json.loads(_render("json", report))["ok"] is report.ok
    suite = ET.fromstring(_render("junit", report))
    failures = sum(case.find("failure") is not None for case in suite)
    assert failures == sum(map(report.fails, report.checks)) == int(suite.get("failures", "0"))
    assert _render("markdown", report).startswith(f"## mtpcheck {report.command}: ")
