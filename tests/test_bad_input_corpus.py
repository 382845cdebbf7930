"""A corpus of malformed checkpoints, each run through the real CLI.

Every case is built in ``tmp_path`` by a small function and run as ``inspect`` (table and JSON)
and ``diff`` against a good reference (or itself). Unreadable or malformed input must exit 2
with exactly one line ``mtpcheck: error: <file>: <reason>`` on stderr naming the file at fault,
and nothing on stdout; a readable checkpoint with a defect (a truncated shard, a missing shard)
is a finding, exit 1. Nothing ever prints a traceback.

Megatron cases damage copies of real checkpoints written once per module by megatron-core
(``tests/megatron_fixtures.py parallel``: a TP=2 torch_dist save and the same model as a legacy
``mp_rank_*`` save), built in a subprocess while the safetensors cases run.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mtpcheck.errors import one_line
from mtpcheck.formats.safe_pickle import Placeholder
from tests.checkpoint_edits import (
    INDEX,
    SHARD1,
    SHARD2,
    set_index,
    tensor_in_both_shards,
    truncate,
    unlink,
)
from tests.conftest import FIXTURES, Run
from tests.torch_saved import load_torch

BUILDER = Path(__file__).with_name("megatron_fixtures.py")
DS = "deepseek_v3"
ITER = "iter_0000004"
TRACKER = "latest_checkpointed_iteration.txt"


# --- where the checkpoints come from --------------------------------------------------------


class Sources:
    """Good checkpoints to damage; the Megatron ones are built in the background on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._log = root / "build.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False

    def start(self) -> None:
        with open(self._log, "w") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-W", "ignore", str(BUILDER), "parallel", str(self.root / "mg")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def megatron(self, kind: str) -> Path:
        """``dist_tp2`` or ``legacy_tp2``: a save root with tracker ``4``."""
        if not self._ready:
            assert self._proc is not None
            if self._proc.wait(timeout=300):
                pytest.fail("building Megatron checkpoints failed:\n" + self._log.read_text())
            self._ready = True
        return self.root / "mg" / f"{kind}_tp2"

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sources]:
    src = Sources(tmp_path_factory.mktemp("corpus_sources"))
    src.start()
    yield src
    src.stop()


@dataclass(frozen=True)
class Built:
    """A damaged input: the CLI argument, the file an error must name, a good reference."""

    arg: Path
    culprit: Path | None = None
    """The path the one-line error must start with (exit 2 only); default: ``arg``."""
    reference: Path | None = None
    """A good checkpoint for ``diff reference arg``; default: ``arg`` itself."""


Build = Callable[[Path, Sources], Built]


@dataclass(frozen=True)
class Case:
    name: str
    build: Build
    exit_code: int
    message: str
    """Regex: the error's reason (exit 2) or the message of a failing finding (exit 1)."""


# --- builders: raw safetensors files --------------------------------------------------------


GIT_LFS_POINTER_FILE = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345\n"
)
"""A Git LFS pointer as https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md writes it."""


def _raw(header: bytes, data: bytes = b"", length: int | None = None) -> Build:
    """One file ``model.safetensors`` made of a length prefix, header bytes and data."""

    def build(tmp: Path, _: Sources) -> Built:
        path = tmp / "model.safetensors"
        n = len(header) if length is None else length
        path.write_bytes(struct.pack("<Q", n) + header + data)
        return Built(path)

    return build


def _header(obj: Any, data: bytes = b"") -> Build:
    """A safetensors file whose JSON header is ``obj``."""
    return _raw(json.dumps(obj).encode(), data)


def _bytes(content: bytes, name: str = "model.safetensors") -> Build:
    def build(tmp: Path, _: Sources) -> Built:
        path = tmp / name
        path.write_bytes(content)
        return Built(path)

    return build


def _entry(dtype: str, shape: list[int], offsets: list[int]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


# --- builders: damaged copies of the shipped fixtures ---------------------------------------


def _fixture(name: str, edit: Callable[[Path], Path | None]) -> Build:
    """Copy fixture ``name`` and damage it; ``edit`` returns the file an error must name."""

    def build(tmp: Path, _: Sources) -> Built:
        root = Path(shutil.copytree(FIXTURES / name, tmp / name))
        culprit = edit(root)
        return Built(root, culprit, FIXTURES / name)

    return build


def _write(rel: str, content: bytes) -> Callable[[Path], Path]:
    def edit(root: Path) -> Path:
        (root / rel).write_bytes(content)
        return root / rel

    return edit


def _config(value: Any, key: str = "num_nextn_predict_layers") -> Callable[[Path], Path]:
    def edit(root: Path) -> Path:
        config = json.loads((root / "config.json").read_text())
        config[key] = value
        (root / "config.json").write_text(json.dumps(config))
        return root / "config.json"

    return edit


def _symlink(rel: str, target: str) -> Callable[[Path], Path]:
    """Replace ``rel`` with a symlink to ``target`` (relative to the link's folder)."""

    def edit(root: Path) -> Path:
        link = root / rel
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(target)
        return link

    return edit


def _mkdir(rel: str) -> Callable[[Path], Path]:
    """Replace the file ``rel`` with an empty directory of the same name."""

    def edit(root: Path) -> Path:
        path = root / rel
        if path.is_file():
            path.unlink()
        path.mkdir()
        return path

    return edit


def _fifo(rel: str) -> Callable[[Path], Path]:
    """Replace the file ``rel`` with a named pipe (opening it for reading would block)."""

    def edit(root: Path) -> Path:
        path = root / rel
        path.unlink()
        os.mkfifo(path)
        return path

    return edit


def _nested_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# --- builders: directories and symlinks -----------------------------------------------------


def _dir(*files: tuple[str, bytes]) -> Build:
    def build(tmp: Path, _: Sources) -> Built:
        root = tmp / "ckpt"
        root.mkdir()
        for name, content in files:
            (root / name).write_bytes(content)
        return Built(root)

    return build


def _self_loop(tmp: Path, _: Sources) -> Built:
    link = tmp / "ckpt"
    link.symlink_to(link)
    return Built(link)


def _hf_cache(revision: bytes) -> Build:
    """A Hugging Face cache folder whose ``refs/main`` holds ``revision``."""

    def build(tmp: Path, _: Sources) -> Built:
        repo = tmp / "models--org--name"
        shutil.copytree(FIXTURES / "mimo", repo / "snapshots" / "abc123")
        (repo / "snapshots" / "def456").mkdir()
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_bytes(revision)
        return Built(repo, repo / "refs" / "main", FIXTURES / "mimo")

    return build


# --- builders: Megatron ---------------------------------------------------------------------


def _megatron(kind: str, edit: Callable[[Path], Path | None]) -> Build:
    """Copy the ``dist`` or ``legacy`` TP=2 save root and damage its iteration directory."""

    def build(tmp: Path, src: Sources) -> Built:
        good = src.megatron(kind)
        root = Path(shutil.copytree(good, tmp / f"{kind}_root"))
        culprit = edit(root / ITER)
        return Built(root, culprit, good)

    return build


def _tracker(text: str, kind: str = "dist") -> Build:
    def build(tmp: Path, src: Sources) -> Built:
        good = src.megatron(kind)
        root = Path(shutil.copytree(good, tmp / f"{kind}_root"))
        (root / TRACKER).write_text(text)
        return Built(root, root / TRACKER, good)

    return build


def _metadata_pickle(obj: Any) -> Callable[[Path], Path]:
    return _write(".metadata", pickle.dumps(obj))


def _zip_without_pickle(iteration: Path) -> Path:
    path = iteration / "common.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/readme.txt", "not a torch.save file")
    return path


def _resave_rank(
    rank: int, change: Callable[[dict[str, Any]], Any], culprit: bool = False
) -> Callable[[Path], Path]:
    """Load a legacy rank file safely, change it (a non-None return replaces the content) and
    write it back with ``torch.save``; the error names the rank file when ``culprit``."""

    def edit(iteration: Path) -> Path:
        import torch

        rank_file = iteration / f"mp_rank_{rank:02d}" / "model_optim_rng.pt"
        content = load_torch(rank_file)
        args = vars(content["args"]).items()
        content["args"] = argparse.Namespace(
            **{k: v for k, v in args if not isinstance(v, Placeholder)}
        )
        del content["rng_state"]  # numpy placeholders cannot be saved again
        replaced = change(content)
        torch.save(content if replaced is None else replaced, rank_file)
        return rank_file if culprit else iteration

    return edit


def _reshape_qkv(content: dict[str, Any]) -> None:
    import torch

    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    content["model"][name] = torch.zeros(8, 32, dtype=torch.bfloat16)


def _drop_model(content: dict[str, Any]) -> None:
    del content["model"]


def _look_alike(spelling: str) -> Callable[[dict[str, Any]], None]:
    """A tampered copy of a layer-1 tensor under a key spelling its layer number another way
    (``int()`` reads both as 1), beside the real one."""

    def change(content: dict[str, Any]) -> None:
        model = content["model"]
        key = next(k for k in model if k.startswith("decoder.layers.1."))
        model[key.replace("layers.1.", f"layers.{spelling}.")] = model[key] + 1

    return change


def _metadata_key_look_alike(iteration: Path) -> Path:
    """The torch_dist index naming one chunk under a key whose layer number has a leading 0
    (written with torch's own pickle of its own classes)."""
    meta = pickle.loads((iteration / ".metadata").read_bytes())
    key = next(k for k in meta.state_dict_metadata if ".layers." in k and "_extra_state" not in k)
    odd = key.replace(".layers.", ".layers.0", 1) if ".layers.1" in key else key + "01"
    meta.state_dict_metadata[odd] = meta.state_dict_metadata[key]
    (iteration / ".metadata").write_bytes(pickle.dumps(meta))
    return iteration / ".metadata"


def _billion_way_tp(content: dict[str, Any]) -> None:
    content["args"].tensor_model_parallel_size = 10**9


def _remove_rank(rel: str) -> Callable[[Path], Path]:
    def edit(iteration: Path) -> Path:
        shutil.rmtree(iteration / rel)
        return iteration

    return edit


def _empty_rank_dir(iteration: Path) -> Path:
    (iteration / "mp_rank_01" / "model_optim_rng.pt").unlink()
    return iteration / "mp_rank_01"


def _release_is_a_file(tmp: Path, src: Sources) -> Built:
    good = src.megatron("dist")
    root = tmp / "dist_root"
    root.mkdir()
    (root / "release").write_bytes(b"not a directory")
    (root / TRACKER).write_text("release")
    return Built(root, root / TRACKER, good)


# --- the corpus -----------------------------------------------------------------------------

F32x2 = _entry("F32", [2], [0, 8])
EIGHT = b"\x00" * 8

CASES = [
    # safetensors header length prefix
    Case("st-length-past-eof", _raw(b"{}", length=1000), 2, r"header length 1000 runs past"),
    Case("st-length-zero", _raw(b"{}", length=0), 2, r"header length is 0$"),
    Case("st-length-2^62", _raw(b"{}", length=2**62), 2, rf"header length {2**62} exceeds"),
    Case("st-length-2^64-1", _raw(b"", length=2**64 - 1), 2, r"exceeds the 100000000-byte"),
    Case(  # a checkout without git-lfs: the pointer file (its spec's format) in place of a shard
        "st-git-lfs-pointer",
        _fixture("mimo", _write("model.safetensors", GIT_LFS_POINTER_FILE)),
        2,
        r"a Git LFS pointer, not the file's content \(fetch it: git lfs pull\)$",
    ),
    Case("st-shorter-than-prefix", _bytes(b"\x05\x00\x00"), 2, r"file is 3 bytes, too short"),
    Case("st-empty-file", _bytes(b""), 2, r"file is 0 bytes, too short"),
    Case("st-header-cut-off", _raw(b'{"a": {"dtype"', length=64), 2, r"header length 64 runs"),
    # header text
    Case("st-not-utf8", _raw(b'{"\xff\xfe": 1}'), 2, r"header is not UTF-8 \(invalid start byte"),
    Case("st-not-json", _raw(b"{not json}"), 2, r"header is not valid JSON \(Expecting"),
    Case("st-json-nested-deep", _raw(_nested_json(100_000)), 2, r"header is not valid JSON"),
    Case("st-json-list", _header([1, 2]), 2, r"header is JSON list, expected an object$"),
    Case("st-json-string", _header("model"), 2, r"header is JSON str, expected an object$"),
    Case("st-entry-not-object", _header({"w": [1, 2]}), 2, r"tensor 'w': entry is not an object"),
    Case("st-metadata-not-object", _header({"__metadata__": [1]}), 2, r"__metadata__ is not an"),
    # tensor entries
    Case("st-unknown-dtype", _header({"w": _entry("F12", [2], [0, 8])}, EIGHT), 2, r"dtype 'F12'"),
    Case("st-dtype-missing", _header({"w": {"shape": [2], "data_offsets": [0, 8]}}), 2, "None"),
    Case(
        "st-shape-not-sizes",
        _header({"w": _entry("F32", [-2], [0, 8])}, EIGHT),
        2,
        r"tensor 'w': shape \[-2\] is not a list of sizes",
    ),
    Case(  # Python's int() refuses more than 4300 digits: a size of 5000 is one line
        "st-shape-past-4300-digits",
        _raw(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}'),
        2,
        r"header is not valid JSON \(Exceeds the limit \(4300 digits\)",
    ),
    Case(  # a dtype of 5000 characters is quoted short
        "st-dtype-of-5000-characters",
        _header({"w": _entry("F" * 5000, [2], [0, 8])}, EIGHT),
        2,
        r"tensor 'w': unknown dtype 'F{196}\.\.\.$",
    ),
    Case(
        "st-shape-disagrees-with-offsets",
        _header({"w": _entry("F32", [3], [0, 8])}, EIGHT),
        2,
        r"tensor 'w': F32\[3\] needs 12 bytes but data_offsets span 8",
    ),
    Case(
        "st-offsets-not-a-pair",
        _header({"w": _entry("F32", [2], [0, 4, 8])}, EIGHT),
        2,
        r"data_offsets \[0, 4, 8\] are not \[begin, end\]",
    ),
    Case(
        "st-offsets-reversed",
        _header({"w": _entry("F32", [0], [8, 0])}, EIGHT),
        2,
        r"data_offsets \[8, 0\] are not",
    ),
    Case(
        "st-offsets-past-eof",
        _header({"w": F32x2, "x": _entry("F32", [2], [8, 16])}, EIGHT),
        1,
        r"model\.safetensors is truncated: header declares 16 data bytes, the file holds 8 "
        r"\(1 tensors cut off: x\)",
    ),
    Case(
        "st-offsets-overlap",
        _header({"w": F32x2, "x": _entry("F32", [2], [4, 12])}, EIGHT * 2),
        2,
        r"tensor 'x': data overlaps the previous tensor",
    ),
    Case(
        "st-offsets-hole",
        _header({"w": F32x2, "x": _entry("F32", [2], [12, 20])}, EIGHT * 3),
        2,
        r"tensor 'x': 4-byte hole before it",
    ),
    Case(
        "st-duplicate-tensor-name",
        _raw(b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "w": {}}', b"\x00"),
        2,
        r"duplicate tensor name 'w'",
    ),
    Case(
        "st-truncated-data",
        _fixture("mimo", truncate("model.safetensors", -100)),
        1,
        r"model\.safetensors is truncated: .* the file holds \d+ \(3 tensors cut off: "
        r"model\.mtp_layers\.0\.",
    ),
    Case(
        "st-trailing-bytes",
        _header({"w": F32x2}, EIGHT * 2),
        1,
        r"model\.safetensors has 8 bytes after the last tensor",
    ),
    # sharded checkpoints and their index
    Case(
        "index-missing-shard",
        _fixture(DS, unlink(SHARD2)),
        1,
        rf"index names shard {SHARD2} \(\d+ tensors\) but the file is missing",
    ),
    Case(
        "index-shard-parent-dir",
        _fixture(DS, set_index(lambda i: i["weight_map"].update(x="../x.safetensors"))),
        2,
        r"shard '\.\./x\.safetensors' points outside the checkpoint folder",
    ),
    Case(
        "index-shard-absolute",
        _fixture(DS, set_index(lambda i: i["weight_map"].update(x="/etc/x.safetensors"))),
        2,
        r"shard '/etc/x\.safetensors' points outside the checkpoint folder",
    ),
    Case(
        "index-shard-not-safetensors",
        _fixture(DS, set_index(lambda i: i["weight_map"].update(x="pytorch_model.bin"))),
        2,
        r"shard 'pytorch_model\.bin' is not a \.safetensors file",
    ),
    Case(
        "index-shard-nul-byte",
        _fixture(DS, set_index(lambda i: i["weight_map"].update(x="a\0.safetensors"))),
        2,
        r"shard 'a\\x00\.safetensors' has a NUL byte in its name",
    ),
    Case(
        "index-tensor-in-two-shards",
        _fixture(DS, tensor_in_both_shards),
        1,
        rf"model\.embed_tokens\.weight is stored in {SHARD1} and {SHARD2}",
    ),
    Case("index-not-json", _fixture(DS, _write(INDEX, b"{weight_map")), 2, r"invalid JSON"),
    Case("index-empty-file", _fixture(DS, _write(INDEX, b"")), 2, r"invalid JSON \(Expecting"),
    Case("index-nested-deep", _fixture(DS, _write(INDEX, _nested_json(100_000))), 2, "JSON"),
    Case(
        "index-without-weight-map",
        _fixture(DS, set_index(lambda i: i.pop("weight_map"))),
        2,
        r"index has no weight_map object of tensor name -> shard file",
    ),
    Case(
        "index-json-list",
        _fixture(DS, _write(INDEX, b"[]")),
        2,
        r"index has no weight_map object",
    ),
    Case("index-is-a-directory", _fixture(DS, _mkdir(INDEX)), 2, r"not a regular file$"),
    Case("index-is-a-fifo", _fixture(DS, _fifo(INDEX)), 2, r"not a regular file$"),
    Case(
        "empty-safetensors-in-dir",
        _fixture("mimo", _write("model.safetensors", b"")),
        2,
        r"file is 0 bytes, too short for a safetensors header",
    ),
    # config.json
    Case("config-empty-file", _fixture("mimo", _write("config.json", b"")), 2, r"invalid JSON"),
    Case(
        "config-not-json",
        _fixture("mimo", _write("config.json", b'{"model_type": mimo}')),
        2,
        r"invalid JSON \(Expecting value",
    ),
    Case(
        "config-not-utf8",
        _fixture("mimo", _write("config.json", b'{"model_type": "\xff"}')),
        2,
        r"cannot read config: not UTF-8 text \(invalid start byte at byte \d+\)$",
    ),
    Case(
        "config-nested-deep",
        _fixture("mimo", _write("config.json", _nested_json(100_000))),
        2,
        r"invalid JSON",
    ),
    Case(
        "config-json-list",
        _fixture("mimo", _write("config.json", b'[{"model_type": "mimo"}]')),
        2,
        r"config is JSON list, expected an object$",
    ),
    Case(
        "config-count-string",
        _fixture("mimo", _config("1")),
        2,
        r"num_nextn_predict_layers is '1'; expected a non-negative integer",
    ),
    Case(
        "config-count-float",
        _fixture("mimo", _config(1.5)),
        2,
        r"num_nextn_predict_layers is 1\.5; expected a non-negative integer",
    ),
    Case(
        "config-count-bool",
        _fixture("mimo", _config(True)),
        2,
        r"num_nextn_predict_layers is True; expected",
    ),
    Case(
        "config-count-negative",
        _fixture("mimo", _config(-1)),
        2,
        r"num_nextn_predict_layers is -1; expected a non-negative integer",
    ),
    Case(
        "config-hidden-layers-string",
        _fixture("mimo", _config("2", "num_hidden_layers")),
        2,
        r"num_hidden_layers is '2'; expected a non-negative integer",
    ),
    Case(
        "config-broken-symlink",
        _fixture("mimo", _symlink("config.json", "blobs/gone")),
        2,
        r"cannot read config: No such file or directory",
    ),
    Case("config-is-a-directory", _fixture("mimo", _mkdir("config.json")), 2, "regular file"),
    Case("config-is-a-fifo", _fixture("mimo", _fifo("config.json")), 2, r"not a regular file$"),
    # directories without weights, symlinks, files where folders are expected and vice versa
    Case("dir-empty", _dir(), 2, r"no safetensors weights found"),
    Case("dir-only-readme", _dir(("README.md", b"# hi")), 2, r"no safetensors weights found"),
    Case(
        "dir-only-pickles",
        _dir(("pytorch_model.bin", b"\x80\x04N.")),
        2,
        r"holds only PyTorch pickle weights; mtpcheck reads safetensors",
    ),
    Case(
        "dir-only-config",
        _dir(("config.json", b'{"model_type": "mimo"}')),
        2,
        r"no safetensors weights found",
    ),
    Case("path-is-a-symlink-loop", _self_loop, 2, r"broken symlink or symlink loop$"),
    Case(
        "shard-symlink-to-itself",
        _fixture("mimo", _symlink("model.safetensors", "model.safetensors")),
        2,
        r"Too many levels of symbolic links",
    ),
    Case(
        "shard-broken-symlink",
        _fixture("mimo", _symlink("model.safetensors", "blobs/gone")),
        2,
        r"No such file or directory",
    ),
    Case(
        "indexed-shard-broken-symlink",
        _fixture(DS, _symlink(SHARD2, "blobs/gone")),
        1,
        rf"index names shard {SHARD2} .* but the file is missing",
    ),
    Case("shard-is-a-directory", _fixture("mimo", _mkdir("model.safetensors")), 2, "directory"),
    Case("shard-is-a-fifo", _fixture("mimo", _fifo("model.safetensors")), 2, "not a regular"),
    Case(
        "indexed-shard-is-a-directory",
        _fixture(DS, _mkdir(SHARD2)),
        2,
        r"Is a directory",
    ),
    Case(
        "shard-name-with-line-break",
        _bytes(b"\x01\x00", name="evil\nname\x1b[2J.safetensors"),
        2,
        r"file is 2 bytes, too short",
    ),
    Case(
        "file-where-a-folder-is-expected",
        _bytes(b"hello", name="checkpoint.txt"),
        2,
        r"not a safetensors file, index or checkpoint directory",
    ),
    Case(
        "hf-cache-ref-not-utf8",
        _hf_cache(b"\xff\xfe"),
        2,
        r"unreadable refs/main",
    ),
    Case(
        "hf-cache-ref-escapes",
        _hf_cache(b"../../../.."),
        2,
        r"refs/main names '\.\./\.\./\.\./\.\.', not a snapshot",
    ),
    # Megatron torch_dist (damaged copies of a real TP=2 save)
    Case(
        "dist-missing-.metadata",
        _megatron("dist", unlink(".metadata")),
        2,
        r"missing: a torch_dist checkpoint needs its \.metadata tensor index",
    ),
    Case(
        "dist-half-written",
        _megatron("dist", lambda it: unlink("metadata.json")(it).parent),
        2,
        r"half-written torch_dist checkpoint: \.metadata is present but metadata\.json is "
        r"missing \(the save did not finish; metadata\.json is written last\)",
    ),
    Case(
        "dist-chunk-past-end-of-distcp",
        _megatron("dist", truncate("__1_0.distcp", -1)),
        1,
        r"__1_0\.distcp is \d+ bytes, but chunks of \d+ tensors end past it",
    ),
    Case(
        "dist-empty-distcp",
        _megatron("dist", truncate("__0_0.distcp", 0)),
        1,
        r"__0_0\.distcp is 0 bytes, but chunks of \d+ tensors end past it",
    ),
    Case(
        "dist-missing-distcp",
        _megatron("dist", unlink("__1_0.distcp")),
        2,
        r"named in \.metadata, but the file is missing",
    ),
    Case(
        "dist-distcp-is-a-directory",
        _megatron("dist", _mkdir("__0_0.distcp")),
        2,
        r"named in \.metadata, but not a file$",
    ),
    Case(
        "dist-metadata-not-pickle",
        _megatron("dist", _write(".metadata", b"this is not a pickle at all")),
        2,
        r"unreadable pickle \(unknown opcode 0x20 at byte 4\)",
    ),
    Case(
        "dist-metadata-empty",
        _megatron("dist", _write(".metadata", b"")),
        2,
        r"unreadable pickle \(EOFError",
    ),
    Case(
        "dist-metadata-wrong-object",
        _megatron("dist", _metadata_pickle({"state_dict_metadata": {}})),
        2,
        r"not a torch\.distributed\.checkpoint Metadata object",
    ),
    Case(
        "dist-metadata-json-invalid",
        _megatron("dist", _write("metadata.json", b"{sharded_backend")),
        2,
        r"invalid JSON",
    ),
    Case(
        "dist-metadata-json-nested-deep",
        _megatron("dist", _write("metadata.json", _nested_json(100_000))),
        2,
        r"invalid JSON",
    ),
    Case(
        "dist-metadata-json-other-backend",
        _megatron("dist", _write("metadata.json", b'{"sharded_backend": "zarr"}')),
        2,
        r"sharded_backend is 'zarr'; only 'torch_dist' is supported",
    ),
    Case(
        "dist-common-pt-not-zip-or-pickle",
        _megatron("dist", _write("common.pt", b"\x00garbage, neither zip nor pickle")),
        2,
        r"unreadable torch\.save file \(not a zip archive",
    ),
    Case(
        "dist-common-pt-zip-without-pickle",
        _megatron("dist", _zip_without_pickle),
        2,
        r"unreadable torch\.save file",
    ),
    Case(
        "dist-run-config-nested-deep",
        _megatron("dist", _write("run_config.yaml", b"model: " + b"[" * 800)),
        2,
        r"invalid YAML",
    ),
    Case(
        "dist-tracker-missing-iteration",
        _tracker("9"),
        2,
        r"names iteration 9, but iter_0000009/ does not exist",
    ),
    Case(
        "dist-tracker-garbage",
        _tracker("latest\n"),
        2,
        r"expected an iteration number or 'release', found 'latest'",
    ),
    Case(
        "dist-release-is-a-file",
        _release_is_a_file,
        2,
        r"names iteration release, but release/ does not exist",
    ),
    # Megatron legacy (damaged copies of a real TP=2 save)
    Case(
        "legacy-missing-tp-rank",
        _megatron("legacy", _remove_rank("mp_rank_01")),
        2,
        r"missing rank directory mp_rank_01 \(1 of 2 missing; args say TP=2, PP=1, EP=1\)",
    ),
    Case(
        "legacy-inconsistent-shard-shapes",
        _megatron("legacy", _resave_rank(1, _reshape_qkv)),
        2,
        r"inconsistent shards of decoder\.layers\.0\.self_attention\.linear_qkv\.weight: "
        r"TP rank 0 \[\d+, 32\] BF16, TP rank 1 \[8, 32\] BF16",
    ),
    Case(
        "legacy-rank-dir-without-file",
        _megatron("legacy", _empty_rank_dir),
        2,
        r"no model_optim_rng\.pt in this rank directory",
    ),
    Case(
        "legacy-rank-file-garbage",
        _megatron("legacy", _write("mp_rank_01/model_optim_rng.pt", b"\x00not a torch file")),
        2,
        r"unreadable",
    ),
    Case(
        "legacy-rank-file-not-a-dict",
        _megatron("legacy", _resave_rank(1, lambda content: [1, 2, 3], culprit=True)),
        2,
        r"expected a dict, found list",
    ),
    Case(
        "legacy-rank-file-without-model",
        _megatron("legacy", _resave_rank(1, _drop_model, culprit=True)),
        2,
        r"no 'model' state dict in this rank file",
    ),
    Case(
        "legacy-layer-number-in-arabic-digits",
        _megatron("legacy", _resave_rank(0, _look_alike("\u0661"), culprit=True)),
        2,
        "spells the number '\u0661' as no writer does, which reads as another key's "
        r"\(ambiguous\)$",
    ),
    Case(
        "legacy-layer-number-with-a-leading-zero",
        _megatron("legacy", _resave_rank(0, _look_alike("01"), culprit=True)),
        2,
        r"spells the number '01' as no writer does, which reads as another key's \(ambiguous\)$",
    ),
    Case(
        "dist-key-number-with-a-leading-zero",
        _megatron("dist", _metadata_key_look_alike),
        2,
        r"spells the number '0?1' as no writer does, which reads as another key's \(ambiguous\)$",
    ),
    Case(  # the rank directories were once named one by one: a billion of them
        "legacy-args-a-billion-tp-ranks",
        _megatron("legacy", _resave_rank(0, _billion_way_tp)),
        2,
        r"args say TP=1000000000, PP=1, EP=1: 1000000000 rank directories, and 2 are here$",
    ),
    Case(  # int() would read a layer number past 4300 digits only to fail
        "legacy-layer-number-of-5000-digits",
        _megatron("legacy", _resave_rank(0, _look_alike("1" * 5000), culprit=True)),
        2,
        r"spells the number '1{56}\.\.\. as no writer does",
    ),
    Case(
        "legacy-tracker-missing-iteration",
        _tracker("12", kind="legacy"),
        2,
        r"names iteration 12, but iter_0000012/ does not exist",
    ),
]


def test_the_corpus_is_large_and_names_are_unique() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


def _assert_clean(run: Run) -> None:
    assert "Traceback" not in run.stdout and "Traceback" not in run.stderr, run
    assert "internal error" not in run.stderr, run


def _assert_one_line_error(run: Run, culprit: Path, reason: str) -> None:
    assert run.exit_code == 2, run
    assert run.stdout == "", run
    prefix = f"mtpcheck: error: {one_line(str(culprit))}: "
    assert run.stderr.endswith("\n") and run.stderr.count("\n") == 1, run
    assert run.stderr.startswith(prefix), f"expected the error to name {culprit}\n{run}"
    line = run.stderr[len(prefix) : -1]
    assert re.search(reason, line), f"{reason!r} not in {line!r}"


def _failing_messages(report: dict[str, Any]) -> list[str]:
    return [
        f["message"]
        for check in report["checks"]
        for f in check["findings"]
        if f["status"] == "fail"
    ]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, sources: Sources, run_cli) -> None:
    built = case.build(tmp_path, sources)
    reference = built.reference or built.arg
    table = run_cli("inspect", built.arg)
    as_json = run_cli("inspect", built.arg, "--format", "json")
    diffed = run_cli("diff", reference, built.arg)
    for run in (table, as_json, diffed):
        _assert_clean(run)
        assert run.exit_code == case.exit_code, run
    if case.exit_code == 2:
        culprit = built.culprit or built.arg
        _assert_one_line_error(table, culprit, case.message)
        _assert_one_line_error(diffed, culprit, case.message)
        assert as_json.stderr == table.stderr
        error = json.loads(as_json.stdout)
        assert error["ok"] is False and error["error"]["path"] == str(culprit)
    else:
        assert table.stderr == "" and "verdict: FAIL" in table.stdout, table
        messages = _failing_messages(json.loads(as_json.stdout))
        assert any(re.search(case.message, m) for m in messages), messages
