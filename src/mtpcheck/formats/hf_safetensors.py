"""Hugging Face checkpoints stored as safetensors.

Accepted inputs: a single ``*.safetensors`` file; a ``*.safetensors.index.json`` file; a
directory holding either; a directory of shards without an index; a Hugging Face cache
repository (``models--org--name`` with ``snapshots/``) or one of its snapshots, whose files
are symlinks to blobs. Only headers are read when opening; tensor bytes are read on demand.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from mtpcheck.errors import InputError, shown
from mtpcheck.formats.chunked_read import (
    TEXT_FILE_BYTES,
    SpanReader,
    read_spans,
    read_tensor_chunks,
    read_text_capped,
    slice_spans,
)
from mtpcheck.formats.config_json import read_config
from mtpcheck.formats.safetensors_header import ShardHeader, read_header
from mtpcheck.formats.safetensors_shards import ShardPlace, cross_checked, shard_tensors, written_as
from mtpcheck.model import (
    ByteSpan,
    CheckpointData,
    Naming,
    files_of,
)

INDEX_SUFFIX = ".safetensors.index.json"
FORMAT = "hf-safetensors"
_BESIDE_THE_INDEX = ShardPlace(absent="the file is missing", present="sits beside the index")
QUANT_CONFIG_FILE = "hf_quant_config.json"


@dataclass(frozen=True)
class HfCheckpoint(CheckpointData):
    """An opened Hugging Face safetensors checkpoint."""

    cross_checked: str = "headers"
    format: str = FORMAT
    naming: Naming = Naming.HF
    quant_config: Mapping[str, Any] | None = None
    """``hf_quant_config.json`` (NVIDIA modelopt's exports), where present."""
    written_as: frozenset[str] = frozenset()
    """The ``format`` each shard's ``__metadata__`` records (``pt``, ``mlx``)."""

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes, read from its shard."""
        return read_tensor_chunks(self.tensors[name], chunk_bytes)

    def byte_spans(self, name: str) -> list[ByteSpan] | None:
        """The tensor's one file range; None when it runs past the end of its shard."""
        meta = self.tensors[name]
        return [ByteSpan(meta.file, meta.offset, meta.nbytes)] if meta.readable else None

    def read_slice_chunks(
        self, name: str, start: int, length: int, chunk_bytes: int
    ) -> Iterator[bytes]:
        """Bytes ``start .. start + length`` of the tensor, read by position."""
        meta = self.tensors[name]
        if not meta.readable:
            return read_tensor_chunks(meta, chunk_bytes)  # raises: past the end of the file
        spans = slice_spans([ByteSpan(meta.file, meta.offset, meta.nbytes)], start, length)
        return read_spans(spans, chunk_bytes, f"file ended while reading tensor {shown(name, 200)}")

    def span_reader(self) -> SpanReader:
        """Positioned reads at ``tensors[name]``'s file and offset (the tensor matcher's fast
        path: reused descriptors, reads into its buffers, holes of sparse files skipped)."""
        return SpanReader()


class HfSafetensorsReader:
    """Reader for Hugging Face safetensors checkpoints."""

    name = FORMAT

    def sniff(self, path: Path) -> bool:
        """A safetensors file, an index, a ``config.json`` or a directory holding shards."""
        if path.is_file():
            return path.name.endswith((".safetensors", INDEX_SUFFIX, "config.json"))
        if not path.is_dir():
            return False
        return (path / "snapshots").is_dir() or any(path.glob("*.safetensors*"))

    def open(self, path: Path) -> HfCheckpoint:
        """Open ``path`` by its headers (and index, when there is one); no tensor bytes are read."""
        root, index_file, single = _locate(path)
        config, config_path = _load_config(root)
        quant_file = root / QUANT_CONFIG_FILE
        quant_config = read_config(quant_file) if quant_file.exists() else None
        with _gc_paused():
            weight_map = None if index_file is None else read_index(index_file)
            headers = _read_headers(root, weight_map, single)
            present = (p.name for p in root.glob("*.safetensors"))
            tensors, issues = shard_tensors(weight_map, headers, present, _BESIDE_THE_INDEX)
        return HfCheckpoint(
            path=str(path),
            config=config,
            config_path=config_path,
            tensors=tensors,
            issues=tuple(issues),
            cross_checked=cross_checked(index_file is not None, len(files_of(tensors))),
            quant_config=quant_config,
            written_as=written_as(headers.values()),
        )


def _read_headers(
    root: Path, weight_map: Mapping[str, str] | None, single: Path | None
) -> dict[str, ShardHeader]:
    """By shard name, the headers of the shards the index names that are there, or without an
    index of ``single`` or of every shard in ``root``."""
    if weight_map is not None:
        named = sorted(set(weight_map.values()))
        return {s: read_header(str(root / s)) for s in named if (root / s).exists()}
    shards = [single] if single else sorted(root.glob("*.safetensors"))
    return {p.name: read_header(str(p)) for p in shards}


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Headers of a large checkpoint are ~100k small dicts and lists without reference cycles;
    the cyclic collector would traverse them again and again while they are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _locate(path: Path) -> tuple[Path, Path | None, Path | None]:
    """Return (directory, index file or None, single shard or None) for an input path."""
    if not path.exists():
        if path.is_symlink():
            raise InputError(path, "broken symlink or symlink loop")
        raise InputError(path, "no such file or directory")
    if path.is_file():
        if path.name.endswith(INDEX_SUFFIX):
            return path.parent, path, None
        if path.name.endswith(".safetensors"):
            return path.parent, None, path
        if path.name == "config.json":
            return _locate(path.parent)
        raise InputError(path, "not a safetensors file, index or checkpoint directory")
    root = _resolve_hf_cache(path)
    indexes = sorted(root.glob("*" + INDEX_SUFFIX))
    if len(indexes) > 1:
        preferred = root / ("model" + INDEX_SUFFIX)
        if preferred not in indexes:
            names = ", ".join(p.name for p in indexes)
            raise InputError(root, f"several safetensors indexes ({names}); pass one of them")
        indexes = [preferred]
    if indexes:
        return root, indexes[0], None
    if any(root.glob("*.safetensors")):
        return root, None, None
    if any(root.glob("*.bin")) or any(root.glob("*.pt")):
        raise InputError(root, "holds only PyTorch pickle weights; mtpcheck reads safetensors")
    raise InputError(
        root, "no safetensors weights found (*.safetensors or *.safetensors.index.json)"
    )


def _resolve_hf_cache(path: Path) -> Path:
    """Map a Hugging Face cache repository folder to the snapshot that ``refs/main`` names."""
    snapshots = path / "snapshots"
    if not snapshots.is_dir():
        return path
    ref = path / "refs" / "main"
    if ref.is_file():
        try:
            revision = ref.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(ref, f"unreadable refs/main ({reason})") from e
        if revision in (".", "..") or any(c in revision for c in "/\\\0"):
            raise InputError(ref, f"refs/main names {shown(revision, 200)}, not a snapshot")
        if revision and (snapshots / revision).is_dir():
            return snapshots / revision
    candidates = sorted(p for p in snapshots.iterdir() if p.is_dir())
    if len(candidates) == 1:
        return candidates[0]
    raise InputError(path, f"Hugging Face cache with {len(candidates)} snapshots; pass one of them")


def _load_config(root: Path) -> tuple[dict[str, Any], str | None]:
    config_path = root / "config.json"
    if not config_path.exists() and not config_path.is_symlink():  # a broken link is an error
        return {}, None
    return read_config(config_path), str(config_path)


def read_index(index_file: Path) -> dict[str, str]:
    """The index's weight map, its shard names checked (no path leaves the folder)."""
    text = read_text_capped(index_file, TEXT_FILE_BYTES)  # a FIFO, a folder: refused
    try:  # DeepSeek-V3's index is 9 MB: decoded typed in about 2/3 of json.loads' time
        weight_map = _INDEX.decode(text).weight_map
    except (ValueError, RecursionError):  # not the usual index: json.loads words the fault
        weight_map = _weight_map_of(index_file, text)
    for shard in set(weight_map.values()):
        if shard.endswith(".safetensors") and not any(c in shard for c in "/\\\0"):
            continue  # a plain file name beside the index (the usual shard): nothing to refuse
        pure = PurePosixPath(shard)
        if pure.is_absolute() or ".." in pure.parts or "\\" in shard:
            raise InputError(
                index_file, f"shard {shown(shard, 200)} points outside the checkpoint folder"
            )
        if "\0" in shard:
            raise InputError(index_file, f"shard {shown(shard, 200)} has a NUL byte in its name")
        if not shard.endswith(".safetensors"):
            raise InputError(index_file, f"shard {shown(shard, 200)} is not a .safetensors file")
    return weight_map


class _IndexFile(msgspec.Struct, gc=False):
    """The part of an index ``read_index`` needs; other keys are skipped unparsed."""

    weight_map: dict[str, str]


_INDEX = msgspec.json.Decoder(_IndexFile)


def _weight_map_of(index_file: Path, text: str) -> dict[str, str]:
    """The weight map of an index the typed decoder refused, or the reason it has none."""
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # Recursion: nested too deep
        raise InputError(index_file, f"invalid JSON ({e})") from e
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    # JSON object keys are strings; values must be too (``type``: JSON has no str subclasses)
    if not isinstance(weight_map, dict) or not set(map(type, weight_map.values())) <= {str}:
        raise InputError(index_file, "index has no weight_map object of tensor name -> shard file")
    return weight_map
