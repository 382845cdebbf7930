"""The stable surface (``mtpcheck``, ``mtpcheck.api``, ``mtpcheck.testing``) as a contract: the
signature of every public name is snapshotted in ``tests/data/public_api.txt``, so a change to
it is a deliberate edit of that file, seen in review.

    python tests/test_public_api.py   # rewrite the snapshot after a deliberate change
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import typing
from pathlib import Path

from mtpcheck import CheckName

SNAPSHOT = Path(__file__).resolve().parent / "data" / "public_api.txt"


def _described(qualified: str, obj: object) -> list[str]:
    """One line per public callable or class, with its signature or its fields."""
    if inspect.ismodule(obj) or isinstance(obj, str):
        return []
    if typing.get_origin(obj) is not None:  # a type alias, such as api.Log
        return [f"{qualified} = {obj}"]
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return [f"{qualified}: enum {', '.join(m.name for m in obj)}"]
    if dataclasses.is_dataclass(obj) and isinstance(obj, type):
        fields = ", ".join(f"{f.name}: {f.type}" for f in dataclasses.fields(obj))
        field_names = {f.name for f in dataclasses.fields(obj)}  # a default is no method
        members = [
            f"{qualified}.{name}{inspect.signature(member)}"
            for name, member in sorted(vars(obj).items())
            if not name.startswith("_") and inspect.isfunction(member) and name not in field_names
        ]
        props = [
            f"{qualified}.{name} (property)"
            for name, member in sorted(vars(obj).items())
            if isinstance(member, property)
        ]
        return [f"{qualified}: dataclass({fields})", *members, *props]
    if isinstance(obj, type):
        return [f"{qualified}: class({', '.join(b.__name__ for b in obj.__bases__)})"]
    return [f"{qualified}{inspect.signature(obj)}"]  # type: ignore[arg-type]


def snapshot() -> str:
    """The public surface, one line per name, sorted."""
    import mtpcheck
    import mtpcheck.api
    import mtpcheck.testing

    lines: list[str] = []
    for module, names in (
        (mtpcheck, mtpcheck.__all__),
        (mtpcheck.api, mtpcheck.api.__all__),
        (mtpcheck.testing, mtpcheck.testing.__all__),
    ):
        for name in names:
            lines += _described(f"{module.__name__}.{name}", getattr(module, name))
    # a default that is a function shows its address: the name alone is the contract
    return "\n".join(sorted(re.sub(r" at 0x[0-9a-f]+", "", line) for line in lines)) + "\n"


def test_the_public_surface_is_as_snapshotted() -> None:
    assert snapshot() == SNAPSHOT.read_text(), (
        "the public API changed: if on purpose, rewrite the snapshot with "
        "`python tests/test_public_api.py` and say so in CHANGELOG.md"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    SNAPSHOT.write_text(snapshot())
    print(f"wrote {SNAPSHOT}")


def test_a_report_gives_one_check_by_name() -> None:
    import pytest

    import mtpcheck
    from tests.conftest import FIXTURES

    report = mtpcheck.diff(FIXTURES / "deepseek_v3", FIXTURES / "glm4_moe")
    assert report.failing == (CheckName.CONFIG, CheckName.TENSORS)
    assert report.check(CheckName.CONFIG).status is mtpcheck.Status.FAIL
    with pytest.raises(KeyError, match="no check 'nope' in this report: integrity, "):
        report.check("nope")
