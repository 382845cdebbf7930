"""The registry of check names (``mtpcheck.CheckName``) is the one place a check's name comes
from: every check a command reports is a member, every member is documented, no check in
src/ is built from a quoted name, and the JSON Schema's enum of names is the registry's.

``python tests/test_check_names.py`` rewrites the schema's ``$defs/check_name`` from the
registry (after a member is added or removed)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest

from mtpcheck import CheckName, CheckResult, Finding, Report, Status
from mtpcheck.model import CHECKS
from mtpcheck.model.check_names import SOURCE_PREFIX, SOURCED

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "mtpcheck"
SCHEMA = ROOT / "src" / "mtpcheck" / "report" / "report.schema.json"
FIXTURES = ROOT / "fixtures"

TARGET_ONLY = {
    CheckName.PAIRING_SHAPE,
    CheckName.PAIRING_EMBEDDING,
    CheckName.PAIRING_VERIFIER,
    CheckName.PAIRING_POSITIONS,
    CheckName.DRAFTER_MTP,
}
"""The ``inspect`` checks that need ``--target``: roundtrip's source audit runs without one."""


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_checks", ROOT / "docs/hooks/checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the registry ------------------------------------------------------------------------------


def test_a_name_is_the_plain_string_reports_print() -> None:
    name = CheckName.MTP_COUNT
    assert name == "mtp-count" and str(name) == f"{name}" == "mtp-count"
    assert json.dumps({"name": name}) == '{"name": "mtp-count"}'
    assert {"mtp-count": 1}[name] == 1  # hashes as its string: a JSON report's keys find it


def test_every_member_is_documented_with_the_commands_that_report_it() -> None:
    assert set(CHECKS) == set(CheckName)
    for name in CheckName:
        assert name.doc and name.commands, name
        assert set(name.commands) <= {"inspect", "diff", "roundtrip", "convert", "accept"}


def test_every_inspect_check_has_its_source_form_and_only_those_do() -> None:
    alone = {
        n
        for n in CheckName
        if "inspect" in n.commands and CHECKS[n].group in ("checkpoint", "drafter")
    }
    assert set(SOURCED) == (alone - TARGET_ONLY) | {CheckName.MCORE_MODEL}
    sources = {n for n in CheckName if n.value.startswith(SOURCE_PREFIX)}
    assert {n.source() for n in SOURCED} == sources
    with pytest.raises(ValueError):
        CheckName.TENSORS.source()


# --- where checks are built --------------------------------------------------------------------


def _quoted_names(path: Path) -> list[str]:
    """``CheckResult(...)`` calls of one module whose name is a string literal, an f-string,
    or a module constant bound to one."""
    tree = ast.parse(path.read_text())
    literal: set[str] = set()
    for node in tree.body:  # NAME = "..."
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.JoinedStr):
            literal |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CheckResult"):
            continue
        given = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "name")]
        for arg in given:
            quoted = isinstance(arg, ast.Constant | ast.JoinedStr)
            if quoted or (isinstance(arg, ast.Name) and arg.id in literal):
                found.append(f"{path}:{node.lineno}")
    return found


def test_no_check_in_src_is_built_from_a_quoted_name() -> None:
    built = [p for p in sorted(SRC.rglob("*.py")) if "CheckResult(" in p.read_text()]
    assert len(built) > 20  # the scan sees the checks
    assert [line for p in built for line in _quoted_names(p)] == []


def test_the_scan_catches_a_quoted_name(tmp_path: Path) -> None:
    path = tmp_path / "quoted.py"
    path.write_text(
        'NAME = "x"\nCheckResult("a", "t", ())\nCheckResult(NAME, "t", ())\n'
        'CheckResult(name=f"s-{n}", title="t", findings=())\nCheckResult(N.X, "t", ())\n'
    )
    assert _quoted_names(path) == [f"{path}:{n}" for n in (2, 3, 4)]


# --- what the commands report ------------------------------------------------------------------


def _fixtures() -> list[Path]:
    dirs = [*FIXTURES.glob("*/config.json"), *FIXTURES.glob("quantized/*/config.json")]
    return sorted(p.parent for p in dirs)


def test_every_check_the_fixtures_report_is_a_member() -> None:
    import mtpcheck

    reports = [mtpcheck.inspect(d) for d in _fixtures()]
    reports += [
        mtpcheck.diff(FIXTURES / "deepseek_v3", FIXTURES / "glm4_moe"),
        mtpcheck.diff(FIXTURES / "mimo", FIXTURES / "mimo", all_tensors=True),
    ]
    assert len(reports) > 30
    seen = {c.name for r in reports for c in r.checks}
    assert all(isinstance(n, CheckName) for n in seen)
    assert {CheckName.INTEGRITY, CheckName.MTP_COUNT, CheckName.TENSORS} <= seen
    for report in reports:
        assert all(c.label == c.name.value for c in report.checks)  # no workload outside accept


# --- the report's accessors --------------------------------------------------------------------


def _report(strict: bool = False) -> Report:
    warn = Finding("w", Status.WARN, "widened")
    fail = Finding("f", Status.FAIL, "lost")
    checks = (
        CheckResult(CheckName.INTEGRITY, "Files", (Finding("i", Status.PASS, "ok"),)),
        CheckResult(CheckName.TENSORS, "Tensors", (warn, fail)),
        CheckResult(CheckName.ACCEPTANCE, "MTP acceptance", (fail,), workload="chat"),
    )
    return Report("diff", (), checks, strict=strict)


def test_failing_findings_are_the_failing_findings_with_their_check_in_report_order() -> None:
    report = _report()
    found = [(c.label, f.subject) for c, f in report.failing_findings()]
    assert found == [("tensors", "f"), ("acceptance/chat", "f")]
    strict = [(c.label, f.subject) for c, f in _report(strict=True).failing_findings()]
    assert strict == [("tensors", "w"), ("tensors", "f"), ("acceptance/chat", "f")]
    assert report.failing == ("tensors", "acceptance/chat")


def test_check_finds_a_check_by_member_or_by_the_name_reports_print() -> None:
    report = _report()
    assert report.check(CheckName.TENSORS) is report.checks[1]
    assert report.check("acceptance/chat") is report.checks[2]
    with pytest.raises(KeyError, match="'mtp-count'.*integrity, tensors, acceptance/chat"):
        report.check(CheckName.MTP_COUNT)


def test_testing_lists_each_failing_finding_by_its_check() -> None:
    from mtpcheck.testing import failing_findings

    assert failing_findings(_report()) == ["tensors: f: lost", "acceptance/chat: f: lost"]


# --- the JSON Schema and the docs --------------------------------------------------------------


def test_the_shipped_schema_lists_the_registry() -> None:
    from mtpcheck.report.json_ import SCHEMA_FILE, check_name_schema

    shipped = json.loads(resources.files("mtpcheck.report").joinpath(SCHEMA_FILE).read_text())
    assert shipped["$defs"]["check_name"] == check_name_schema(), (
        "report.schema.json is not the registry's: rewrite it with "
        "`python tests/test_check_names.py`"
    )
    assert shipped["$defs"]["check"]["properties"]["name"] == {"$ref": "#/$defs/check_name"}


def test_the_schema_takes_the_registry_and_workloads_and_nothing_else() -> None:
    import jsonschema

    from mtpcheck.report.json_ import check_name_schema

    valid = jsonschema.Draft202012Validator(check_name_schema()).is_valid
    assert all(valid(n.value) for n in CheckName if n is not CheckName.ACCEPTANCE)
    assert valid("acceptance/in_domain")
    assert not any(valid(n) for n in ("acceptance", "acceptance/", "mtp_count", "empty", ""))


def test_every_member_is_in_the_docs_table_and_each_page_gets_its_table() -> None:
    hook = _hook()
    table = hook.all_table()
    for name in CheckName:
        assert f"| `{name}` | {hook._cell(name.doc)} |" in table, name
    for page, (marker, _) in hook.PAGES.items():
        rendered = hook.render((ROOT / "docs" / page).read_text(), page)
        assert marker not in rendered and "| check | what it checks |" in rendered, page
    inspect_page = hook.group_table("checkpoint")
    assert "`mtp-count`" in inspect_page and "`mcore-model`" not in inspect_page
    with pytest.raises(ValueError, match="marker"):
        hook.render("no marker here", "checks.md")


def _rewrite_schema() -> None:
    """Put the registry's ``$defs/check_name`` into the shipped schema, in its place."""
    from mtpcheck.report.json_ import check_name_schema

    schema = json.loads(SCHEMA.read_text())
    schema["$defs"]["check_name"] = check_name_schema()
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    _rewrite_schema()
    print(f"wrote {SCHEMA}")
