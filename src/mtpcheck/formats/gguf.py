"""GGUF files (llama.cpp), read from their documented layout without loading tensor data.

A GGUF file is a little-endian header: the magic ``GGUF``, a version (2 or 3), the tensor and
metadata counts, the metadata key/values, then one record per tensor (name, dimensions
innermost first, ``ggml_type``, offset into the data section), the data section starting at
the next multiple of ``general.alignment`` (32 by default). Only the header is read on open;
a tensor's bytes are read at its offset.

The metadata becomes the checkpoint's config: every key as it stands, plus ``model_type``
``gguf``, the ``architecture``, ``quantization_config`` ``{"quant_method": "gguf"}`` (each
tensor's ggml type is its own declaration), and ``block_count`` / ``nextn_predict_layers``
read from the architecture's own keys (``glm4moe.block_count``), with ``num_hidden_layers``
the blocks that are not nextn layers. Shapes are given outermost first, as torch and
safetensors give them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mtpcheck.dtypes import DTYPES
from mtpcheck.errors import InputError
from mtpcheck.formats.chunked_read import read_tensor_chunks
from mtpcheck.model import IntegrityIssue, Naming, TensorMeta

FORMAT = "gguf"
MAGIC = b"GGUF"
SUFFIX = ".gguf"
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 24
"""A key or string value longer than this is taken as a corrupt header."""

GGML_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    30: "BF16",
}
"""``ggml_type`` ids (``ggml.h``) of the types the dtype registry knows, by its codes."""

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufCheckpoint:
    """An opened GGUF file."""

    path: str
    config: dict[str, Any]
    config_path: str | None
    tensors: dict[str, TensorMeta]
    issues: tuple[IntegrityIssue, ...] = ()
    cross_checked: str = "a GGUF header"
    format: str = FORMAT
    naming: Naming = Naming.GGUF

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        return read_tensor_chunks(self.tensors[name], chunk_bytes)


class _Header:
    """Sequential reads of a GGUF header, each failure an :class:`InputError` on the file."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise InputError(self.path, "file ends inside the GGUF header (truncated?)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise InputError(self.path, f"a GGUF header string claims {n} bytes (corrupt header)")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(self.path, "a GGUF header string is not UTF-8") from e

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if count > MAX_STRING:
                raise InputError(self.path, f"a GGUF array claims {count} items (corrupt header)")
            return [self.value(inner) for _ in range(count)]
        raise InputError(self.path, f"unknown GGUF metadata value type {kind}")


def read_gguf(path: Path) -> GgufCheckpoint:
    """Open one GGUF file: its header only."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = _Header(f, path)
            if header.take(4) != MAGIC:
                raise InputError(path, "not a GGUF file (no GGUF magic)")
            version = header.unpack("<I")
            if version not in (2, 3):
                raise InputError(path, f"GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = header.unpack("<Q"), header.unpack("<Q")
            metadata = {header.string(): header.value(header.unpack("<I")) for _ in range(n_kv)}
            records = [_tensor_record(header) for _ in range(n_tensors)]
            end = f.tell()
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise InputError(path, f"general.alignment {alignment!r} is not a positive integer")
    data_start = -(-end // alignment) * alignment
    tensors: dict[str, TensorMeta] = {}
    for name, dims, type_id, offset in records:
        if name in tensors:
            raise InputError(path, f"tensor {name!r} is declared twice in the GGUF header")
        tensors[name] = _meta(path, name, dims, type_id, data_start + offset, size)
    cut = sorted(n for n, m in tensors.items() if not m.readable)
    issues = (
        (
            IntegrityIssue(
                "truncated-file",
                path.name,
                f"{path.name} ends before the bytes of {len(cut)} tensor(s) "
                f"({', '.join(cut[:3])}{' ...' if len(cut) > 3 else ''})",
            ),
        )
        if cut
        else ()
    )
    return GgufCheckpoint(
        path=str(path),
        config=gguf_config(metadata),
        config_path=str(path),
        tensors=dict(sorted(tensors.items())),
        issues=issues,
    )


def _tensor_record(header: _Header) -> tuple[str, tuple[int, ...], int, int]:
    name = header.string()
    n_dims = header.unpack("<I")
    if n_dims > 8:
        raise InputError(header.path, f"tensor {name!r} claims {n_dims} dimensions")
    dims = tuple(header.unpack("<Q") for _ in range(n_dims))
    return name, dims, header.unpack("<I"), header.unpack("<Q")


def _meta(
    path: Path, name: str, dims: tuple[int, ...], type_id: int, offset: int, size: int
) -> TensorMeta:
    code = GGML_TYPES.get(type_id)
    if code is None:
        raise InputError(path, f"tensor {name!r} has ggml_type {type_id}, which mtpcheck lacks")
    shape = tuple(reversed(dims))  # GGUF lists the innermost dimension first
    numel = 1
    for d in shape:
        numel *= d
    nbytes = DTYPES[code].nbytes(numel)
    if nbytes is None:
        raise InputError(path, f"tensor {name!r}: {numel} elements do not fill {code} blocks")
    return TensorMeta(name, code, shape, str(path), offset, nbytes, offset + nbytes <= size)


def gguf_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata as a config: every key, plus the counts the MTP checks read."""
    arch = metadata.get("general.architecture")
    config: dict[str, Any] = {
        **metadata,
        "model_type": FORMAT,
        "architecture": arch,
        "quantization_config": {"quant_method": FORMAT},  # types are per tensor, in the header
    }
    if isinstance(arch, str):
        blocks = metadata.get(f"{arch}.block_count")
        nextn = metadata.get(f"{arch}.nextn_predict_layers")
        if isinstance(blocks, int):
            config["block_count"] = blocks
            config["num_hidden_layers"] = blocks - (nextn if isinstance(nextn, int) else 0)
        if isinstance(nextn, int):
            config["nextn_predict_layers"] = nextn
        width = metadata.get(f"{arch}.embedding_length")
        if isinstance(width, int):
            config["hidden_size"] = width
    return config


class GgufReader:
    """Reader for single GGUF files (or a directory holding exactly one, and no safetensors)."""

    name = FORMAT

    def sniff(self, path: Path) -> bool:
        if path.is_file():
            return path.suffix == SUFFIX or _has_magic(path)
        if not path.is_dir() or any(path.glob("*.safetensors*")):
            return False  # a safetensors checkpoint that ships a GGUF too is read as such
        return bool(list(path.glob("*" + SUFFIX)))

    def open(self, path: Path) -> GgufCheckpoint:
        if path.is_dir():
            files = sorted(path.glob("*" + SUFFIX))
            if len(files) != 1:
                raise InputError(path, f"holds {len(files)} GGUF files; name the one to open")
            path = files[0]
        return read_gguf(path)


def _has_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False
