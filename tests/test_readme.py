"""The JSON report page's example (docs/report.md) documents exactly the fields reports have."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES

REPORT_PAGE = Path(__file__).resolve().parent.parent / "docs" / "report.md"
ACCEPT_ONLY = (
    "acceptance",
    "acceptance_deltas",
    "online_acceptance",
    "engine_acceptance",
    "engine_deltas",
    "server_acceptance",
)


def _report_example() -> dict[str, Any]:
    """The page's one ``jsonc`` block, its comments removed."""
    (block,) = re.findall(r"```jsonc\n(.*?)```", REPORT_PAGE.read_text(), re.S)
    return json.loads(re.sub(r"\s+//[^\n]*", "", block))


def _shape(report: dict[str, Any]) -> dict[str, set[str]]:
    """Field names per place in a report."""
    places: dict[str, set[str]] = {"": set(report)}

    def first(items: Any) -> dict[str, Any]:
        return items[0] if isinstance(items, list) and items else {}

    inputs = first(report.get("inputs"))
    places["inputs[]"] = set(inputs)
    places["inputs[].mtp_layers[]"] = set(first(inputs.get("mtp_layers")))
    check = first(report.get("checks"))
    places["checks[]"] = set(check)
    places["checks[].findings[]"] = set(first(check.get("findings")))
    places["tensors[]"] = set(first(report.get("tensors")))
    for key in ACCEPT_ONLY:
        places[f"{key}[]"] = set(first(report.get(key)))
    return places


def test_json_example_names_every_field_and_no_other(run_cli, tmp_path: Path) -> None:
    example = _shape(_report_example())
    runs = [
        run_cli("inspect", FIXTURES / "deepseek_v3", "--format", "json"),
        run_cli("diff", FIXTURES / "mimo", FIXTURES / "mimo", "--format", "json"),
        run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path, "--format", "json"),
    ]
    real: dict[str, set[str]] = {}
    for run in runs:
        assert run.exit_code == 0, run
        for place, keys in _shape(json.loads(run.stdout)).items():
            real.setdefault(place, set()).update(keys)
    for place, keys in real.items():
        assert keys <= example[place], (place, keys - example[place])
    accept_only = set(ACCEPT_ONLY)
    for place, keys in example.items():
        if place.startswith(tuple(accept_only)):
            continue
        assert keys - accept_only <= real[place], (place, keys - real[place])
    commands = re.search(r'"command": "inspect",\s+// or (.*)', REPORT_PAGE.read_text())
    assert commands is not None
    assert set(re.findall(r'"(\w+)"', commands.group(1))) == {"diff", "roundtrip", "accept"}


def test_json_example_documents_the_accept_fields(run_cli, tmp_path: Path) -> None:
    from tests.test_accept_cli import FIXTURE

    lines = (FIXTURE / "workloads" / "in_domain.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "w.jsonl").write_text("".join(lines[:2]))
    run = run_cli(
        "accept", FIXTURE, "--workload", f"code={tmp_path / 'w.jsonl'}", "--compare", FIXTURE,
        "--online", "--new-tokens", "4", "--format", "json",
    )  # fmt: skip
    assert run.exit_code == 0, run
    real = _shape(json.loads(run.stdout))
    example = _shape(_report_example())
    for place in ("", "acceptance[]", "acceptance_deltas[]", "online_acceptance[]"):
        assert real[place] == example[place], place


def test_the_front_page_stays_under_200_lines() -> None:
    """The README is the front page; the manual is the docs site."""
    readme = Path(__file__).resolve().parent.parent / "README.md"
    assert len(readme.read_text().splitlines()) < 200
