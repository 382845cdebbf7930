"""mtpcheck never changes what it checks: file bytes, metadata and listings stay identical."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES


def snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """sha256, mode and mtime (ns) of every file, keyed by relative path; dirs included."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st_ = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            out[str(p.relative_to(root))] = (digest, st_.st_mode, st_.st_mtime_ns)
    return out


@pytest.fixture
def readonly_copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of two fixtures with every write bit removed; restored for cleanup."""
    root = tmp_path / "inputs"
    for name in ("deepseek_v3", "mimo"):
        shutil.copytree(FIXTURES / name, root / name)
    paths = [*root.rglob("*"), root]
    for p in paths:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield root
    for p in paths:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "{root}/deepseek_v3"],
        ["inspect", "{root}/deepseek_v3/model.safetensors.index.json", "--format", "json"],
        ["diff", "{root}/deepseek_v3", "{root}/mimo", "--all"],
        ["diff", "{root}/mimo", "{root}/mimo"],
    ],
)
def test_read_only_inputs_are_untouched(readonly_copy: Path, run_cli, args: list[str]) -> None:
    before = snapshot(readonly_copy)
    run = run_cli(*[a.format(root=readonly_copy) for a in args])
    assert run.exit_code in (0, 1), run
    assert snapshot(readonly_copy) == before
