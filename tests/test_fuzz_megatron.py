"""Property-based fuzzing of the Megatron torch_dist reader.

A real torch_dist checkpoint (the MiMo fixture through the built-in converter: stacked layer
keys, a column-split ``linear_fc1``, ``_extra_state`` byte items) is written once per module.
Each example replaces its ``.metadata`` or ``metadata.json`` with fuzzed content: arbitrary
bytes, byte-level mutations of the real pickle, or real ``torch.distributed.checkpoint``
``Metadata`` objects with edited keys, sizes, chunks, dtypes and storage entries pointing in
and out of the ``.distcp`` file. Opening the checkpoint and reading every tensor must either
work (each tensor yields exactly its bytes, in bounded chunks) or raise one of mtpcheck's own
errors with a one-line message; nothing else may escape.

The default run tries a few examples per property; ``MTPCHECK_FUZZ_EXAMPLES=2000`` runs the
long campaign.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from mtpcheck.errors import MtpcheckError, raised_by_us
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.safe_pickle import load_raw_pickle
from tests.conftest import FIXTURES

EXAMPLES = int(os.environ.get("MTPCHECK_FUZZ_EXAMPLES", "50"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CHUNK = 256
"""Read chunk size: small, so that every tensor is read in several chunks."""

DTYPES: list[Any] = [
    torch.bfloat16,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.bool,
    torch.uint8,
    torch.float8_e4m3fn,
    torch.float8_e8m0fnu,
    torch.complex64,
    torch.complex32,
    torch.quint8,
    torch.bits8,
    torch.uint4,
    torch.float4_e2m1fn_x2,
    "bfloat16",
    None,
]
PATHS = [
    "__0_0.distcp",
    "__1_0.distcp",
    "common.pt",
    ".metadata",
    "metadata.json",
    ".",
    "",
    "../__0_0.distcp",
    "/etc/passwd",
    "sub/__0_0.distcp",
]
KEYS = [
    "decoder.layers.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.linear_fc1.weight",
    "decoder.layers.mlp.experts.experts.linear_fc1.weight",
    "decoder.layers.1.mlp.experts.experts.3.linear_fc1.weight_w",
    "decoder.layers.1.mlp.experts.experts.3.linear_fc1.weight_v",
    "mtp.layers.0.mtp_model_layer.mlp.linear_fc1.weight_w",
    "mtp.layers.0.eh_proj.weight",
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "optimizer.state.exp_avg",
    "layers",
    "decoder.layers.",
    "experts.experts",
]


@dataclass(frozen=True)
class Original:
    """The real checkpoint and the files each example replaces and restores."""

    iteration: Path
    metadata_bytes: bytes
    metadata_json: bytes
    metadata: Any
    distcp_size: int


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Original:
    from mtpcheck.convert.builtin import hf_to_megatron

    root = tmp_path_factory.mktemp("fuzz_megatron") / "mimo"
    iteration = hf_to_megatron(open_checkpoint(FIXTURES / "mimo"), root)
    meta = iteration / ".metadata"
    return Original(
        iteration=iteration,
        metadata_bytes=meta.read_bytes(),
        metadata_json=(iteration / "metadata.json").read_bytes(),
        metadata=load_raw_pickle(meta),
        distcp_size=(iteration / "__0_0.distcp").stat().st_size,
    )


@pytest.fixture(scope="module")
def place(original: Original) -> Iterator[Any]:
    """``place(name, content)`` writes one file of the checkpoint; restored after each probe."""

    def put(name: str, content: bytes) -> None:
        (original.iteration / name).write_bytes(content)

    yield put
    _restore(original)


def _restore(original: Original) -> None:
    (original.iteration / ".metadata").write_bytes(original.metadata_bytes)
    (original.iteration / "metadata.json").write_bytes(original.metadata_json)


def _outcome(text: str) -> None:
    """Count outcomes in ``--hypothesis-show-statistics`` (how deep the examples reach)."""
    if currently_in_test_context():
        event(text)


def _refusal(e: MtpcheckError) -> None:
    """A refusal is one line, and never a bug of mtpcheck's worded as bad input: no error it
    was made from was raised in mtpcheck's own frames."""
    assert len(str(e).splitlines()) == 1, str(e)
    cause = e.__cause__
    while cause is not None:
        assert not raised_by_us(cause), f"{e} hides a bug: {cause!r}"
        cause = cause.__cause__


def probe(original: Original) -> None:
    """Open the checkpoint and read every tensor; only mtpcheck's errors may escape, and none
    of them may hide an error raised in mtpcheck's own code."""
    try:
        try:
            ckpt = open_checkpoint(original.iteration)
        except MtpcheckError as e:
            _refusal(e)
            _outcome("open refused")
            return
        refused = 0
        for name, meta in ckpt.tensors.items():
            try:
                got = 0
                for chunk in ckpt.read_chunks(name, CHUNK):
                    assert 0 < len(chunk) <= CHUNK, (name, len(chunk))
                    got += len(chunk)
            except MtpcheckError as e:
                _refusal(e)
                refused += 1
                continue
            assert meta.readable, f"{name} read although marked unreadable"
            assert got == meta.nbytes, (name, got, meta.nbytes)
        _outcome("opened; " + ("a tensor refused" if refused else "every tensor read"))
    finally:
        _restore(original)


def test_the_real_checkpoint_reads(original: Original) -> None:
    ckpt = open_checkpoint(original.iteration)
    assert ckpt.issues == () and len(ckpt.tensors) > 20
    probe(original)


# --- arbitrary and mutated bytes ----------------------------------------------------------


@FUZZ
@given(raw=st.one_of(st.binary(max_size=600), st.binary(max_size=600).map(b"\x80\x04".__add__)))
def test_arbitrary_metadata_bytes(original: Original, place: Any, raw: bytes) -> None:
    place(".metadata", raw)
    probe(original)


@FUZZ
@given(data=st.data())
def test_mutated_metadata_pickle(original: Original, place: Any, data: st.DataObject) -> None:
    blob = bytearray(original.metadata_bytes)
    size = len(blob)
    for _ in range(data.draw(st.integers(1, 6), label="mutations")):
        at = data.draw(st.integers(0, size - 1), label="at")
        kind = data.draw(st.sampled_from(["set", "insert", "delete", "truncate"]), label="kind")
        if kind == "set":
            blob[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del blob[at : at + data.draw(st.integers(1, 8))]
        else:
            del blob[at:]
        size = len(blob)
        if size == 0:
            break
    place(".metadata", bytes(blob))
    probe(original)


# --- structurally plausible Metadata objects ----------------------------------------------

dims = st.one_of(
    st.lists(st.integers(0, 70), max_size=4).map(torch.Size),
    st.lists(st.integers(0, 2**40), max_size=3).map(torch.Size),
    st.lists(st.integers(-3, 70), max_size=4).map(tuple),
    st.lists(st.one_of(st.integers(-(2**63), 2**63), st.none(), st.text(max_size=2)), max_size=3),
    st.none(),
)
key_text = st.one_of(st.sampled_from(KEYS), st.text(max_size=30), st.integers(0, 3))
storage_offset = st.one_of(st.integers(0, 200_000), st.integers(-(2**63), 2**64), st.none())


def _storage_info(data: st.DataObject, original: Original) -> Any:
    real = list(original.metadata.storage_data.values())
    path = data.draw(st.sampled_from(PATHS))
    if data.draw(st.booleans(), label="real span"):
        span = data.draw(st.sampled_from(real))
        offset, length = span.offset, span.length
    else:
        end = original.distcp_size
        offset = data.draw(st.one_of(st.integers(0, end), storage_offset), label="offset")
        length = data.draw(st.one_of(st.integers(0, end), storage_offset), label="length")
    return _StorageInfo(path, offset, length)


def _edit(md: Any, data: st.DataObject, original: Original) -> None:
    """One random edit of a copy of the real Metadata."""
    state, storage = md.state_dict_metadata, md.storage_data
    tensor_keys = sorted(
        (k for k, v in state.items() if isinstance(v, TensorStorageMetadata)), key=repr
    )
    if not tensor_keys:
        return
    kind = data.draw(
        st.sampled_from(
            [
                "size",
                "chunk",
                "drop-chunk",
                "duplicate-chunk",
                "storage",
                "unlink-storage",
                "dtype",
                "rename",
                "replace-item",
                "add-item",
                "containers",
            ]
        ),
        label="edit",
    )
    key = data.draw(st.sampled_from(tensor_keys), label="key")
    item = state[key]
    if kind == "size":
        item.size = data.draw(dims)
    elif kind == "chunk" and item.chunks:
        i = data.draw(st.integers(0, len(item.chunks) - 1))
        old = item.chunks[i]
        index = _index(key, old.offsets)
        new = ChunkStorageMetadata(
            offsets=data.draw(st.one_of(st.just(old.offsets), dims)),
            sizes=data.draw(st.one_of(st.just(old.sizes), dims)),
        )
        item.chunks[i] = new
        if data.draw(st.booleans(), label="move storage"):
            info = storage.pop(index, None) or _storage_info(data, original)
            storage[_index(key, new.offsets)] = info
    elif kind == "drop-chunk" and item.chunks:
        item.chunks.pop(data.draw(st.integers(0, len(item.chunks) - 1)))
    elif kind == "duplicate-chunk" and item.chunks:
        item.chunks.append(data.draw(st.sampled_from(item.chunks)))
    elif kind == "storage" and item.chunks:
        chunk = data.draw(st.sampled_from(item.chunks))
        storage[_index(key, chunk.offsets)] = _storage_info(data, original)
    elif kind == "unlink-storage" and item.chunks:
        chunk = data.draw(st.sampled_from(item.chunks))
        storage.pop(_index(key, chunk.offsets), None)
    elif kind == "dtype":
        item.properties = TensorProperties(dtype=data.draw(st.sampled_from(DTYPES)))
    elif kind == "rename":
        new_key = data.draw(key_text, label="new key")
        state[new_key] = state.pop(key)
        for index in [i for i in storage if getattr(i, "fqn", None) == key]:
            storage[_index(new_key, index.offset)] = storage.pop(index)
    elif kind == "replace-item":
        state[key] = data.draw(
            st.sampled_from([None, 0, "tensor", BytesStorageMetadata(), [item], {"size": 1}])
        )
    elif kind == "add-item":
        size = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
        new_key = data.draw(key_text, label="new key")
        chunks = []
        for _ in range(data.draw(st.integers(0, 3))):
            offsets = torch.Size(data.draw(st.lists(st.integers(0, 6), min_size=len(size))))
            sizes = torch.Size(data.draw(st.lists(st.integers(0, 6), min_size=len(size))))
            chunks.append(ChunkStorageMetadata(offsets[: len(size)], sizes[: len(size)]))
            storage[_index(new_key, offsets[: len(size)])] = _storage_info(data, original)
        dtype = data.draw(st.sampled_from(DTYPES))
        state[new_key] = TensorStorageMetadata(
            TensorProperties(dtype=dtype), torch.Size(size), chunks
        )
    elif kind == "containers":
        which = data.draw(st.sampled_from(["state", "storage", "both"]))
        junk = data.draw(st.sampled_from([None, [], (), "x", 3, {}]))
        if which in ("state", "both"):
            md.state_dict_metadata = junk
        if which in ("storage", "both"):
            md.storage_data = junk


def _index(key: Any, offsets: Any) -> MetadataIndex:
    """The storage key of a chunk; offsets torch.Size cannot hold are dropped."""
    try:
        return MetadataIndex(key, offsets)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return MetadataIndex(key, None)


@FUZZ
@given(data=st.data())
def test_edited_metadata_objects(original: Original, place: Any, data: st.DataObject) -> None:
    md = copy.deepcopy(original.metadata)
    for _ in range(data.draw(st.integers(1, 5), label="edits")):
        if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
            break
        _edit(md, data, original)
    try:
        blob = pickle.dumps(md)
    except (TypeError, ValueError, pickle.PicklingError, OverflowError):
        return  # not every combination can be pickled; nothing to test
    place(".metadata", blob)
    probe(original)


@FUZZ
@given(data=st.data())
def test_synthetic_metadata(original: Original, place: Any, data: st.DataObject) -> None:
    """Metadata built from scratch: random keys, sizes and chunks over the real data file."""
    state: dict[Any, Any] = {}
    storage: dict[Any, Any] = {}
    for _ in range(data.draw(st.integers(0, 4), label="items")):
        key = data.draw(key_text, label="key")
        size = data.draw(st.lists(st.integers(0, 5), max_size=3), label="size")
        chunks = []
        for _ in range(data.draw(st.integers(0, 3), label="chunks")):
            offsets = torch.Size([data.draw(st.integers(0, max(d, 0))) for d in size])
            sizes = torch.Size([data.draw(st.integers(0, 5)) for _ in size])
            chunks.append(ChunkStorageMetadata(offsets, sizes))
            storage[MetadataIndex(key, offsets)] = _storage_info(data, original)
        dtype = data.draw(st.sampled_from(DTYPES))
        state[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(size), chunks)
    place(".metadata", pickle.dumps(Metadata(state_dict_metadata=state, storage_data=storage)))
    probe(original)


# --- metadata.json ------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=8)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    content=st.one_of(
        json_value.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(st.text(max_size=20), json_value, max_size=4).map(
            lambda d: json.dumps({"sharded_backend": "torch_dist", **d}).encode()
        ),
        st.fixed_dictionaries({"sharded_backend": json_value}).map(
            lambda d: json.dumps(d).encode()
        ),
        st.binary(max_size=64),
        st.integers(1, 3000).map(lambda n: b'{"a":' * n),
    )
)
def test_metadata_json_variants(original: Original, place: Any, content: bytes) -> None:
    place("metadata.json", content)
    probe(original)
