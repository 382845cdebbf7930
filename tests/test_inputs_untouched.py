"""mtpcheck never changes what it checks: file bytes, metadata and listings stay identical.

Also for the commands that write: ``roundtrip`` (built-in converters, temporary checkpoints in
``--workdir``) and both ``convert`` directions leave their source exactly as it was.
"""

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


def _read_only_copy(root: Path, sources: dict[str, Path]) -> Iterator[Path]:
    """Copy ``sources`` under ``root`` with every write bit removed; restored for cleanup."""
    for name, src in sources.items():
        shutil.copytree(src, root / name)
    paths = [*root.rglob("*"), root]
    for p in paths:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield root
    for p in paths:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


@pytest.fixture
def readonly_copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of two fixtures with every write bit removed; restored for cleanup."""
    yield from _read_only_copy(
        tmp_path / "inputs", {name: FIXTURES / name for name in ("deepseek_v3", "mimo")}
    )


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


@pytest.fixture(scope="module")
def mimo_megatron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MiMo fixture as a Megatron torch_dist checkpoint (built-in converter)."""
    from mtpcheck.convert.builtin import hf_to_megatron
    from mtpcheck.formats import open_checkpoint

    root = tmp_path_factory.mktemp("untouched") / "mimo_megatron"
    hf_to_megatron(open_checkpoint(FIXTURES / "mimo"), root)
    return root


@pytest.fixture
def readonly_sources(tmp_path: Path, mimo_megatron: Path) -> Iterator[Path]:
    """Read-only copies of the MiMo fixture (HF) and of its Megatron conversion."""
    yield from _read_only_copy(
        tmp_path / "inputs", {"mimo": FIXTURES / "mimo", "mimo_megatron": mimo_megatron}
    )


@pytest.mark.parametrize(
    "args",
    [
        ["roundtrip", "{root}/mimo", "--workdir", "{work}"],
        ["roundtrip", "{root}/mimo", "--workdir", "{work}", "--all", "--format", "json"],
        ["convert", "hf-to-megatron", "{root}/mimo", "{work}/megatron"],
        [
            "convert",
            "megatron-to-hf",
            "{root}/mimo_megatron",
            "{work}/hf",
            "--hf-config",
            "{root}/mimo/config.json",
        ],
    ],
    ids=["roundtrip", "roundtrip-all-json", "hf-to-megatron", "megatron-to-hf"],
)
def test_writing_commands_leave_their_source_untouched(
    readonly_sources: Path, tmp_path: Path, run_cli, args: list[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(readonly_sources)
    run = run_cli(*[a.format(root=readonly_sources, work=work) for a in args])
    assert run.exit_code == 0, run
    assert snapshot(readonly_sources) == before
    if args[0] == "roundtrip":
        assert list(work.iterdir()) == []  # temporary checkpoints removed
    else:
        assert any(p.is_file() for p in work.rglob("*"))  # the conversion wrote its output
