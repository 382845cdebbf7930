"""The Hugging Face reader accepts every documented input shape and reports index faults."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mtpcheck.errors import ConfigError, InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.hf_safetensors import read_index
from tests.conftest import FIXTURES, write_safetensors

DS = FIXTURES / "deepseek_v3"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def _issue_kinds(path: Path) -> list[tuple[str, str]]:
    return [(i.kind, i.subject) for i in open_checkpoint(path).issues]


def test_sharded_directory_with_index() -> None:
    ckpt = open_checkpoint(DS)
    assert ckpt.format == "hf-safetensors"
    assert len(ckpt.tensors) == 73
    assert ckpt.issues == ()
    assert ckpt.config["model_type"] == "deepseek_v3"
    assert Path(ckpt.tensors["model.layers.2.eh_proj.weight"].file).name == SHARD2


@pytest.mark.parametrize("entry", ["model.safetensors.index.json", "config.json"])
def test_index_or_config_file_opens_the_directory(entry: str) -> None:
    assert set(open_checkpoint(DS / entry).tensors) == set(open_checkpoint(DS).tensors)


def test_single_file_and_directory_agree() -> None:
    single = FIXTURES / "mimo" / "model.safetensors"
    assert set(open_checkpoint(single).tensors) == set(open_checkpoint(single.parent).tensors)
    assert open_checkpoint(single).config["model_type"] == "mimo"


def test_shards_without_index(tmp_path: Path) -> None:
    for name in (SHARD1, SHARD2, "config.json"):
        shutil.copy(DS / name, tmp_path / name)
    ckpt = open_checkpoint(tmp_path)
    assert set(ckpt.tensors) == set(open_checkpoint(DS).tensors)
    assert ckpt.issues == ()


def test_hf_cache_snapshot_of_symlinks(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--tiny"
    blobs = repo / "blobs"
    snap = repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    for i, name in enumerate(sorted(os.listdir(DS))):
        blob = blobs / f"blob{i}"
        shutil.copy(DS / name, blob)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    for path in (repo, snap):
        ckpt = open_checkpoint(path)
        assert len(ckpt.tensors) == 73 and ckpt.issues == ()


def test_missing_shard_is_a_finding(tmp_path: Path) -> None:
    shutil.copytree(DS, tmp_path / "c")
    (tmp_path / "c" / SHARD2).unlink()
    ckpt = open_checkpoint(tmp_path / "c")
    assert [(i.kind, i.subject) for i in ckpt.issues] == [("missing-shard", SHARD2)]
    assert "model.layers.2.eh_proj.weight" not in ckpt.tensors


def test_tensor_in_two_shards_and_unindexed_shard(tmp_path: Path) -> None:
    c = tmp_path / "c"
    shutil.copytree(DS, c)
    write_safetensors(c / "extra.safetensors", {"lm_head.weight": ("U8", [1], b"x")})
    assert _issue_kinds(c) == [("unindexed-shard", "extra.safetensors")]
    index = json.loads((c / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra.only"] = "extra.safetensors"
    (c / "model.safetensors.index.json").write_text(json.dumps(index))
    write_safetensors(
        c / "extra.safetensors",
        {"lm_head.weight": ("U8", [1], b"x"), "extra.only": ("U8", [1], b"y")},
    )
    assert _issue_kinds(c) == [("tensor-in-two-shards", "lm_head.weight")]


def test_index_naming_the_wrong_shard_or_an_absent_tensor(tmp_path: Path) -> None:
    c = tmp_path / "c"
    shutil.copytree(DS, c)
    index_path = c / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["lm_head.weight"] = SHARD1
    index["weight_map"]["ghost.weight"] = SHARD2
    index_path.write_text(json.dumps(index))
    assert _issue_kinds(c) == [
        ("tensor-not-in-shard", "ghost.weight"),
        ("index-wrong-shard", "lm_head.weight"),
    ]
    assert "lm_head.weight" in open_checkpoint(c).tensors


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/abs.safetensors", "x.bin"])
def test_index_shard_outside_folder_or_wrong_type_is_refused(tmp_path: Path, shard: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shard}}))
    with pytest.raises(InputError, match="model.safetensors.index.json: shard"):
        open_checkpoint(tmp_path)


def test_an_index_only_json_reads_opens_as_json_reads_it(tmp_path: Path) -> None:
    """The typed index decoder refuses what plain JSON parsing takes (NaN in the metadata, a
    repeated weight_map); the index is then read as json.loads reads it, never refused."""
    c = tmp_path / "c"
    shutil.copytree(DS, c)
    index_path = c / "model.safetensors.index.json"
    weight_map = json.loads(index_path.read_text())["weight_map"]
    text = (
        '{"metadata": {"total_size": NaN}, "weight_map": {"stale": "x.safetensors"}, '
        f'"weight_map": {json.dumps(weight_map)}}}'
    )
    index_path.write_text(text)
    assert read_index(index_path) == weight_map == json.loads(text)["weight_map"]
    assert _issue_kinds(c) == []


@pytest.mark.parametrize(
    "weight_map", ['{"a": 5}', '["a"]', "null", '{"a": "x.safetensors", "b": ["y"]}']
)
def test_an_index_whose_weight_map_is_not_names_to_files_is_refused(
    tmp_path: Path, weight_map: str
) -> None:
    index_path = tmp_path / "model.safetensors.index.json"
    index_path.write_text(f'{{"weight_map": {weight_map}}}')
    with pytest.raises(InputError, match="index has no weight_map object of tensor name"):
        read_index(index_path)


def test_directory_without_weights(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no safetensors weights found"):
        open_checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(InputError, match="only PyTorch pickle weights"):
        open_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("{broken", "invalid JSON"), ("[1]", "config is JSON list"), ("\xff", "invalid JSON")],
)
def test_malformed_config(tmp_path: Path, text: str, reason: str) -> None:
    shutil.copy(FIXTURES / "mimo" / "model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=reason):
        open_checkpoint(tmp_path)


def test_symlink_loop_is_an_input_error(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    with pytest.raises(InputError, match="broken symlink"):
        open_checkpoint(loop)


def test_read_chunks_streams_exact_bytes() -> None:
    ckpt = open_checkpoint(DS)
    meta = ckpt.tensors["model.embed_tokens.weight"]
    chunks = list(ckpt.read_chunks("model.embed_tokens.weight", 300))
    assert [len(c) for c in chunks] == [300] * 6 + [248]
    with open(meta.file, "rb") as f:
        f.seek(meta.offset)
        assert b"".join(chunks) == f.read(meta.nbytes)
