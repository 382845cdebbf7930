"""The shipped fixtures are exactly what fixtures/make_fixtures.py writes."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from tests.conftest import FAMILY_FIXTURES, FIXTURES

WRITTEN_WITH = json.loads((FIXTURES / "mimo" / "config.json").read_text())["transformers_version"]


def test_regenerated_fixtures_are_byte_identical(tmp_path: Path, monkeypatch) -> None:
    import transformers

    if transformers.__version__ != WRITTEN_WITH:
        pytest.skip(f"fixtures were written with transformers {WRITTEN_WITH}")
    monkeypatch.setattr(sys, "argv", ["make_fixtures.py", str(tmp_path)])
    runpy.run_path(str(FIXTURES / "make_fixtures.py"), run_name="__main__")
    for family in FAMILY_FIXTURES:
        shipped = sorted(p.name for p in (FIXTURES / family).iterdir())
        assert sorted(p.name for p in (tmp_path / family).iterdir()) == shipped
        for name in shipped:
            ours, theirs = tmp_path / family / name, FIXTURES / family / name
            if name == "config.json":
                # the writing transformers version is recorded; everything else must match
                a, b = json.loads(ours.read_text()), json.loads(theirs.read_text())
                a.pop("transformers_version", None)
                b.pop("transformers_version", None)
                assert a == b, family
            else:
                assert ours.read_bytes() == theirs.read_bytes(), f"{family}/{name}"


def test_regenerated_2026_fixtures_are_byte_identical(tmp_path: Path) -> None:
    import transformers

    if transformers.__version__ != WRITTEN_WITH:
        pytest.skip(f"fixtures were written with transformers {WRITTEN_WITH}")
    script = runpy.run_path(str(FIXTURES / "make_families_2026.py"))
    script["main"]([str(tmp_path)])
    for family in script["FAMILIES_2026"]:
        for name in ("config.json", "model.safetensors"):
            ours, theirs = tmp_path / family / name, FIXTURES / family / name
            assert ours.read_bytes() == theirs.read_bytes(), f"{family}/{name}"
