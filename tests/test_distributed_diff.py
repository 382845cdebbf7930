"""The verdict does not depend on how the comparison is split: ranks, threads, segments.

``torchrun --nproc-per-node 2 -m mtpcheck diff`` (gloo on loopback) must print the same JSON
report and exit with the same code as a single process; the threaded, segmented fast path of
the tensor matcher must give the same comparisons as the plain chunk-by-chunk reference.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mtpcheck.checks import tensor_match
from mtpcheck.formats import open_checkpoint
from mtpcheck.pipeline.distributed import split_by_bytes
from mtpcheck.units import human_size
from tests.conftest import FIXTURES, flip_bit, write_safetensors
from tests.launch import child_env, torchrun


def _single(*args: str | Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mtpcheck", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)


def _torchrun(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return torchrun(*args, timeout=120)


def _flipped_pair(tmp_path: Path) -> tuple[Path, Path]:
    """deepseek_v3 (two shards) and a copy with one bit flipped in its MTP projection."""
    a = FIXTURES / "deepseek_v3"
    b = tmp_path / "flipped"
    shutil.copytree(a, b)
    index = json.loads((b / "model.safetensors.index.json").read_text())
    name = "model.layers.2.eh_proj.weight"
    shard = b / index["weight_map"][name]
    with open(shard, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        begin, _ = json.loads(f.read(n))[name]["data_offsets"]
    flip_bit(shard, 8 + n + begin + 6, bit=2)
    return a, b


@pytest.mark.parametrize("case", ["equal", "flipped", "missing-input"])
def test_two_ranks_report_what_one_process_reports(tmp_path: Path, case: str) -> None:
    if case == "equal":
        a, b = FIXTURES / "glm4_moe", FIXTURES / "glm4_moe"
    elif case == "flipped":
        a, b = _flipped_pair(tmp_path)
    else:
        a, b = FIXTURES / "mimo", tmp_path / "absent"
    one = _single("diff", "--all", a, b, "--format", "json")
    two = _torchrun("diff", "--all", a, b, "--format", "json")
    assert json.loads(two.stdout) == json.loads(one.stdout), two.stderr  # rank 0 only prints
    # torchrun exits 1 when any rank fails and lists each rank's own exit code
    ranks = [int(c) for c in re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", two.stderr, re.M)]
    if one.returncode == 0:
        assert two.returncode == 0 and not ranks, two.stderr
    else:
        assert two.returncode == 1 and ranks == [one.returncode] * 2, two.stderr
    expected = {"equal": 0, "flipped": 1, "missing-input": 2}[case]
    assert one.returncode == expected, one.stderr
    if case == "flipped":
        bad = [t for t in json.loads(one.stdout)["tensors"] if t["status"] != "equal"]
        assert [t["name"] for t in bad] == ["model.layers.2.eh_proj.weight"]
        assert bad[0]["differing_elements"] == 1 and bad[0]["first_difference"] == [0, 3]


def test_byte_split_is_a_balanced_deterministic_partition() -> None:
    costs = [5, 0, 100, 7, 7, 60, 0, 40]
    shares = split_by_bytes(costs, 2)
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    assert shares == split_by_bytes(costs, 2)
    loads = [sum(costs[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(costs)
    assert split_by_bytes(costs, 1) == [list(range(len(costs)))]
    assert split_by_bytes([], 3) == [[], [], []]


class _Plain:
    """A checkpoint without ``span_reader``: the matcher takes its reference path."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.tensors = inner.tensors  # type: ignore[attr-defined]

    def read_chunks(self, name: str, chunk_bytes: int):  # noqa: ANN201
        return self.inner.read_chunks(name, chunk_bytes)  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(4))
def test_threaded_segments_match_the_reference_path(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    tensors = {}
    for k, dtype in enumerate(["BF16", "F32", "F8_E4M3", "I64", "F16", "U8"]):
        width = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8, "F16": 2, "U8": 1}[dtype]
        shape = [rng.choice([0, 1, 3, 64]), rng.choice([1, 7, 1000])]
        tensors[f"t{k}"] = (dtype, shape, rng.randbytes(width * shape[0] * shape[1]))
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_safetensors(a, tensors)
    write_safetensors(b, tensors)
    data = bytearray(b.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    for _ in range(rng.choice([1, 5, 400])):
        data[rng.randrange(8 + n, len(data))] ^= 1 << rng.randrange(8)
    b.write_bytes(bytes(data))
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    pairs = [(name, name) for name in sorted(ca.tensors)]
    reference = tensor_match.compare_many(_Plain(ca), _Plain(cb), pairs, chunk_bytes=4096)
    assert any(c.status.value == "bits_differ" for c in reference)
    monkeypatch.setattr(tensor_match, "SEGMENT_BYTES", 3 * 4096)  # many segments per tensor
    for threads in (1, 3):
        fast = tensor_match.compare_many(ca, cb, pairs, chunk_bytes=4096, threads=threads)
        assert fast == reference
    assert tensor_match.compare_many(ca, cb, pairs) == reference  # default sizes


def test_holes_of_sparse_files_compare_as_zeros(tmp_path: Path) -> None:
    shape = [4096, 1024]  # 8 MiB of BF16 zeros, written as a hole
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    nbytes = 2 * shape[0] * shape[1]
    blob = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": [0, nbytes]}})
    for path in (a, b):
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob.encode())
            f.truncate(8 + len(blob) + nbytes)
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    assert tensor_match.compare(ca, "w", cb, "w").status.value == "equal"
    meta = cb.tensors["w"]
    with open(b, "r+b") as f:  # data in one file: read, compared against the other's zeros
        f.seek(meta.offset + meta.nbytes - 2)
        f.write(b"\x80\x3f")
    diff = tensor_match.compare(ca, "w", open_checkpoint(b), "w")
    assert diff.status.value == "bits_differ" and diff.differing_elements == 1
    assert diff.first_difference == (4095, 1023) and diff.max_abs_diff == 1.0


class _Rank:
    """One of two ranks, with a real in-process torch store standing in for the rendezvous."""

    world = 2

    def __init__(self, rank: int, store: object) -> None:
        self.rank, self._store = rank, store

    def store(self) -> object:
        return self._store


def test_rank_0_reports_the_bytes_every_rank_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from mtpcheck.pipeline import distributed

    monkeypatch.setattr(distributed, "POLL_S", 3600.0)  # the test polls, not the thread
    store = dist.HashStore()
    lines: list[str] = []
    shares = [3 * 2**20, 1 * 2**20]
    progress = distributed._SharedProgress(_Rank(0, store), "k/1", shares, lines.append)  # type: ignore[arg-type]
    rank1 = distributed._SharedProgress(_Rank(1, store), "k/1", shares, lines.append)  # type: ignore[arg-type]
    assert rank1.thread is None  # only rank 0 watches
    clock = iter(range(10, 1000, 10))
    ticker = progress.ticker
    ticker.clock, ticker.interval, ticker.start, ticker.last = lambda: float(next(clock)), 0, 0, 0
    progress.report()  # nothing posted yet
    rank1.post(2**20)  # rank 1 finished its share
    progress.report()
    progress.post(2**20)  # rank 0 a third of its own
    progress.report()
    progress.close(7)
    assert lines[0].startswith("comparing on 2 ranks: 1.00 MiB of 4.00 MiB (25%), ")
    assert lines[0].endswith(", at 1 of 2 ranks done")
    assert lines[1].startswith("comparing on 2 ranks: 2.00 MiB of 4.00 MiB (50%), ")
    assert lines[-1].startswith("comparing on 2 ranks: 7 tensors, 4.00 MiB in ")


def test_under_torchrun_rank_0_alone_reports_the_whole_comparison() -> None:
    a = FIXTURES / "glm4_moe"
    env = {"MTPCHECK_PROGRESS_INTERVAL": "0"}
    two = torchrun("diff", "--all", a, a, "--format", "json", timeout=120, env=env)
    assert two.returncode == 0, two.stderr
    ckpt = open_checkpoint(a)
    whole = human_size(sum(m.nbytes for m in ckpt.tensors.values()))  # both ranks' shares
    lines = [line for line in two.stderr.splitlines() if line.startswith("mtpcheck: ")]
    assert len(lines) == 1, two.stderr  # rank 1 says nothing
    assert lines[0].startswith(
        f"mtpcheck: comparing on 2 ranks: {len(ckpt.tensors)} tensors, {whole} in "
    )
    assert len(json.loads(two.stdout)["tensors"]) == len(ckpt.tensors)  # stdout: the report
    quiet = torchrun("diff", "--all", a, a, "--quiet", timeout=120, env=env)
    assert quiet.returncode == 0 and "mtpcheck: " not in quiet.stderr
