"""Inputs that change under mtpcheck's feet, and bounded memory while comparing.

A shard deleted or truncated after the checkpoint was opened (headers read) but before its
bytes are compared must end in one ``InputError`` line (exit 2), never a traceback or a hang.
Comparing a tensor larger than the chunk size must stream it: no chunk handed to the
comparison is larger than the chunk size, and the whole tensor is never held in memory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import mtpcheck.formats
from mtpcheck.checks.diff_checks import diff_report
from mtpcheck.checks.tensor_match import CHUNK_BYTES, compare
from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import IntegrityIssue, TensorMeta, TensorStatus
from tests.conftest import FIXTURES, Run

HANG_SECONDS = 60


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """Fail, instead of hanging the run, when a test takes longer than HANG_SECONDS."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no answer within {HANG_SECONDS} s: mtpcheck hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def megatron_mimo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real torch_dist checkpoint: the MiMo fixture through the built-in converter."""
    from mtpcheck.convert.builtin import hf_to_megatron

    root = tmp_path_factory.mktemp("resilience") / "mimo_megatron"
    hf_to_megatron(open_checkpoint(FIXTURES / "mimo"), root)
    return root


def _copy_tree(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def _delete(path: Path) -> None:
    path.unlink()


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted": (_delete, r"No such file or directory"),
    "truncated": (_truncate, r"file ended (while reading tensor '.*' \(truncated\?\)|inside)"),
}
"""How a data file is damaged after opening, and the reason the one-line error gives."""


def _victim(kind: str, root: Path) -> Path:
    """The data file to damage in a copy of the MiMo checkpoint (HF or torch_dist)."""
    return root / ("model.safetensors" if kind == "hf" else "release/__0_0.distcp")


@pytest.fixture
def pair(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], tuple[Path, Path]]:
    """``pair(kind)``: (good, copy to damage) of the MiMo checkpoint as HF or torch_dist."""

    def make(kind: str) -> tuple[Path, Path]:
        good = FIXTURES / "mimo" if kind == "hf" else request.getfixturevalue("megatron_mimo")
        return good, _copy_tree(good, tmp_path / f"{kind}_copy")

    return make


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("kind", ["hf", "dist"])
def test_damaged_after_opening_raises_one_input_error(
    pair: Callable[[str], tuple[Path, Path]], kind: str, damage: str
) -> None:
    good, copy = pair(kind)
    a, b = open_checkpoint(good), open_checkpoint(copy)
    victim = _victim(kind, copy)
    action, reason = DAMAGES[damage]
    action(victim)
    with pytest.raises(InputError) as e:
        diff_report(a, b, all_tensors=True)
    assert e.value.path == str(victim)
    assert re.search(reason, e.value.reason), e.value.reason
    assert len(str(e.value).splitlines()) == 1


LEGACY_SCRIPT = """
import json, os, sys
from mtpcheck.checks.diff_checks import diff_report
from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
for good, copy, victim, damage in json.loads(sys.argv[1]):
    a, b = open_checkpoint(good), open_checkpoint(copy)
    if damage == "deleted":
        os.unlink(victim)
    else:
        os.truncate(victim, 1000)
    try:
        diff_report(a, b, all_tensors=True)
        print(json.dumps(None))
    except InputError as e:
        print(json.dumps([e.path, e.reason, str(e)]))
"""


LEGACY_RANK_FILE = Path("iter_0000001", "mp_rank_00", "model_optim_rng.pt")


def _legacy_checkpoint(root: Path) -> None:
    """A one-rank Megatron-LM legacy save (``mp_rank_00/model_optim_rng.pt``)."""
    import argparse

    import torch

    g = torch.Generator().manual_seed(0)
    model = {
        "decoder.layers.0.mlp.linear_fc2.weight": torch.randn(64, 64, generator=g),
        "mtp.layers.0.eh_proj.weight": torch.randn(64, 128, generator=g),
    }
    args = argparse.Namespace(num_layers=1, mtp_num_layers=1, tensor_model_parallel_size=1)
    (root / LEGACY_RANK_FILE).parent.mkdir(parents=True)
    torch.save({"args": args, "model": model, "iteration": 1}, root / LEGACY_RANK_FILE)
    (root / "latest_checkpointed_iteration.txt").write_text("1")


def test_legacy_rank_file_damaged_after_opening(tmp_path: Path) -> None:
    """Legacy rank files are memory-mapped: reading one cut short would kill the process
    (SIGBUS), so this runs in a subprocess and the damage must be caught before reading."""
    good = tmp_path / "good"
    _legacy_checkpoint(good)
    jobs = []
    for damage in sorted(DAMAGES):
        copy = _copy_tree(good, tmp_path / damage)
        jobs.append((str(good), str(copy), str(copy / LEGACY_RANK_FILE), damage))
    done = subprocess.run(
        [sys.executable, "-c", LEGACY_SCRIPT, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    results = [json.loads(line) for line in done.stdout.splitlines()]
    expected = {
        "deleted": r"No such file or directory",
        "truncated": r"changed since it was opened \(\d+ bytes, now 1000\)",
    }
    for (_, _, victim, damage), result in zip(jobs, results, strict=True):
        assert result is not None, f"{damage}: no error"
        path, reason, message = result
        assert path == victim and re.search(expected[damage], reason), result
        assert len(message.splitlines()) == 1


def _patch_open(monkeypatch: pytest.MonkeyPatch, target: Path, damage: Callable[[], None]) -> None:
    """The CLI's open_checkpoint: open as usual, then damage ``target``'s files."""
    real = mtpcheck.formats.open_checkpoint

    def opening_then_damaging(path: Any, trust_pickle: bool = False) -> Any:
        ckpt = real(path, trust_pickle)
        if Path(path) == target:
            damage()
        return ckpt

    monkeypatch.setattr(mtpcheck.formats, "open_checkpoint", opening_then_damaging)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize(
    ("kind", "command"),
    [("hf", "diff"), ("dist", "diff"), ("hf", "inspect")],
)
def test_cli_reports_damage_after_opening_in_one_line(
    pair: Callable[[str], tuple[Path, Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_cli: Callable[..., Run],
    kind: str,
    command: str,
    damage: str,
) -> None:
    if command == "inspect":  # the shared-copies check reads the bytes of the MTP copies
        copy = _copy_tree(FIXTURES / "deepseek_v3", tmp_path / "ds")
        victim = copy / "model-00002-of-00002.safetensors"
        args: tuple[Any, ...] = ("inspect", copy)
    else:
        good, copy = pair(kind)
        victim = _victim(kind, copy)
        args = ("diff", good, copy, "--all")
    action, reason = DAMAGES[damage]
    _patch_open(monkeypatch, copy, lambda: action(victim))
    run = run_cli(*args)
    assert run.exit_code == 2, run
    assert run.stdout == "" and "Traceback" not in run.stderr, run
    assert run.stderr.startswith(f"mtpcheck: error: {victim}: "), run
    assert run.stderr.count("\n") == 1 and re.search(reason, run.stderr), run


# --- bounded memory -------------------------------------------------------------------------


def _write_u8_shard(path: Path, name: str, nbytes: int, marks: Mapping[int, int]) -> None:
    """A safetensors file with one U8 tensor of ``nbytes`` zero bytes (a sparse file: holes
    cost no disk) except the bytes given in ``marks``."""
    header = (
        f'{{"{name}":{{"dtype":"U8","shape":[{nbytes}],"data_offsets":[0,{nbytes}]}}}}'.encode()
    )
    header += b" " * (-len(header) % 8)
    start = 8 + len(header)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + nbytes)
        for at, value in marks.items():
            f.seek(start + at)
            f.write(bytes([value]))


@dataclass
class ChunkSpy:
    """A checkpoint seen only through the Checkpoint protocol, recording every chunk read."""

    inner: Any
    sizes: list[int] = field(default_factory=list)
    requested: list[int] = field(default_factory=list)

    @property
    def path(self) -> str:
        return str(self.inner.path)

    @property
    def format(self) -> str:
        return str(self.inner.format)

    @property
    def config(self) -> Mapping[str, Any]:
        return self.inner.config  # type: ignore[no-any-return]

    @property
    def config_path(self) -> str | None:
        return self.inner.config_path  # type: ignore[no-any-return]

    @property
    def tensors(self) -> Mapping[str, TensorMeta]:
        return self.inner.tensors  # type: ignore[no-any-return]

    @property
    def issues(self) -> tuple[IntegrityIssue, ...]:
        return self.inner.issues  # type: ignore[no-any-return]

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        self.requested.append(chunk_bytes)
        for chunk in self.inner.read_chunks(name, chunk_bytes):
            self.sizes.append(len(chunk))
            yield chunk


def _two_checkpoints(tmp_path: Path, nbytes: int, flip_at: int) -> tuple[Path, Path]:
    name = "model.layers.0.big.weight"
    a, b = tmp_path / "a", tmp_path / "b"
    for root, marks in ((a, {0: 1, nbytes - 1: 2}), (b, {0: 1, nbytes - 1: 2, flip_at: 7})):
        root.mkdir()
        _write_u8_shard(root / "model.safetensors", name, nbytes, marks)
    return a, b


def test_small_chunks_are_all_the_comparison_sees(tmp_path: Path) -> None:
    chunk = 64 * 1024
    nbytes = 40 * chunk + 123  # not a multiple of the chunk size
    a_path, b_path = _two_checkpoints(tmp_path, nbytes, flip_at=nbytes - 50)
    a, b = ChunkSpy(open_checkpoint(a_path)), ChunkSpy(open_checkpoint(b_path))
    name = next(iter(a.tensors))
    tracemalloc.start()
    try:
        result = compare(a, name, b, name, chunk_bytes=chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.status is TensorStatus.BITS_DIFFER and result.differing_elements == 1
    assert result.first_difference == (nbytes - 50,)
    for spy in (a, b):
        assert spy.requested == [chunk]
        assert max(spy.sizes) <= chunk and sum(spy.sizes) == nbytes and len(spy.sizes) == 41
    assert peak < 8 * chunk, f"{peak} bytes held while comparing {nbytes}-byte tensors"


def test_a_tensor_larger_than_the_chunk_size_is_never_held_whole(tmp_path: Path) -> None:
    """The real diff path (whichever reader the matcher picks) at the real chunk size."""
    nbytes = 4 * CHUNK_BYTES + 5
    a_path, b_path = _two_checkpoints(tmp_path, nbytes, flip_at=3 * CHUNK_BYTES + 1)
    a, b = open_checkpoint(a_path), open_checkpoint(b_path)
    tracemalloc.start()
    try:
        report = diff_report(a, b, all_tensors=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    (result,) = report.tensors
    assert result.status is TensorStatus.BITS_DIFFER and result.differing_elements == 1
    assert result.first_difference == (3 * CHUNK_BYTES + 1,)
    assert peak < nbytes // 2, f"{peak} bytes held while comparing {nbytes}-byte tensors"
