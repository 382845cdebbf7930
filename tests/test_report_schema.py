"""The JSON report's schema (``src/mtpcheck/report/report.schema.json``, ``schema_version``
1) is shipped in the package, is a valid JSON Schema, and rejects what is not a report.

Every ``--format json`` output the suite produces through ``run_cli`` is validated against it
(``tests/conftest.py``); these tests make sure that validation can fail."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from mtpcheck.report.json_ import SCHEMA_VERSION
from tests.conftest import FIXTURES

SCHEMA = json.loads(resources.files("mtpcheck.report").joinpath("report.schema.json").read_text())


def _valid(document: dict) -> bool:
    return jsonschema.Draft202012Validator(SCHEMA).is_valid(document)


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$defs"]["report"]["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    from click.testing import CliRunner

    from mtpcheck.cli import cli

    out = CliRunner().invoke(
        cli, ["diff", str(FIXTURES / "mimo"), str(FIXTURES / "mimo"), "--all", "--format", "json"]
    )
    assert out.exit_code == 0, out.stdout
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r.pop("ok"),
        lambda r: r.update(schema_version=3),
        lambda r: r["checks"][0].update(status="passed"),
        lambda r: r["tensors"][0].update(status="same"),
        lambda r: r["tensors"][0].pop("values_differing"),
        lambda r: r["inputs"][0].update(surprise=1),
        lambda r: r.update(acceptance=[]),  # accept-only fields on a diff
        lambda r: r["checks"][0].update(findings=[]),
    ],
    ids=["no-ok", "version-3", "check-status", "tensor-status", "field-gone", "extra-field",
         "accept-fields", "no-findings"],
)  # fmt: skip
def test_what_is_not_a_report_is_rejected(report: dict, damage) -> None:
    assert _valid(report)
    broken = copy.deepcopy(report)
    damage(broken)
    assert not _valid(broken)


def test_the_error_object_of_exit_2_is_valid(run_cli, tmp_path: Path) -> None:
    run = run_cli("inspect", tmp_path / "nothing", "--format", "json")
    assert run.exit_code == 2
    document = json.loads(run.stdout)
    assert _valid(document) and document["error"]["reason"]
