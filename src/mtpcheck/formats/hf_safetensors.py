"""Hugging Face checkpoints stored as safetensors.

Accepted inputs: a single ``*.safetensors`` file; a ``*.safetensors.index.json`` file; a
directory holding either; a directory of shards without an index; a Hugging Face cache
repository (``models--org--name`` with ``snapshots/``) or one of its snapshots, whose files
are symlinks to blobs. Only headers are read when opening; tensor bytes are read on demand.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from mtpcheck.errors import InputError
from mtpcheck.formats.chunked_read import SpanReader, read_spans, read_tensor_chunks, slice_spans
from mtpcheck.formats.config_json import read_config
from mtpcheck.formats.safetensors_header import ShardHeader, read_header
from mtpcheck.model import (
    ByteSpan,
    CheckpointData,
    IntegrityIssue,
    Naming,
    TensorMeta,
    TensorTable,
    files_of,
)

INDEX_SUFFIX = ".safetensors.index.json"
FORMAT = "hf-safetensors"
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
        return read_spans(spans, chunk_bytes, f"file ended while reading tensor {name!r}")

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
            if index_file is not None:
                tensors, issues, headers = _open_indexed(root, index_file)
            else:
                shards = [single] if single else sorted(root.glob("*.safetensors"))
                tensors, issues, headers = _open_unindexed(shards)
        return HfCheckpoint(
            path=str(path),
            config=config,
            config_path=config_path,
            tensors=tensors,
            issues=tuple(issues),
            cross_checked=cross_checked(index_file is not None, len(files_of(tensors))),
            quant_config=quant_config,
            written_as=written_as(headers),
        )


def cross_checked(indexed: bool, files: int) -> str:
    """What opening a safetensors checkpoint checked, in words."""
    if indexed:
        return "headers and index"
    return "header" if files <= 1 else "headers (no index)"


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
            raise InputError(ref, f"refs/main names {revision!r}, not a snapshot")
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
    if index_file.exists() and not index_file.is_file():  # a directory, or a blocking FIFO
        raise InputError(index_file, "not a regular file")
    try:
        text = index_file.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(index_file, e.strerror or str(e)) from e
    except UnicodeDecodeError as e:
        raise InputError(index_file, f"invalid JSON ({e})") from e
    try:  # DeepSeek-V3's index is 9 MB: decoded typed in about 2/3 of json.loads' time
        weight_map = _INDEX.decode(text).weight_map
    except (ValueError, RecursionError):  # not the usual index: json.loads words the fault
        weight_map = _weight_map_of(index_file, text)
    for shard in set(weight_map.values()):
        pure = PurePosixPath(shard)
        if pure.is_absolute() or ".." in pure.parts or "\\" in shard:
            raise InputError(index_file, f"shard {shard!r} points outside the checkpoint folder")
        if "\0" in shard:
            raise InputError(index_file, f"shard {shard!r} has a NUL byte in its name")
        if not shard.endswith(".safetensors"):
            raise InputError(index_file, f"shard {shard!r} is not a .safetensors file")
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


def written_as(headers: Iterable[ShardHeader]) -> frozenset[str]:
    """The ``format`` values the shards' ``__metadata__`` record."""
    return frozenset(h.metadata["format"] for h in headers if "format" in h.metadata)


def _open_indexed(
    root: Path, index_file: Path
) -> tuple[Mapping[str, TensorMeta], list[IntegrityIssue], list[ShardHeader]]:
    weight_map = read_index(index_file)
    issues: list[IntegrityIssue] = []
    headers: dict[str, ShardHeader] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = root / shard
        if not shard_path.exists():
            expected = sorted(n for n, s in weight_map.items() if s == shard)
            issues.append(
                IntegrityIssue(
                    "missing-shard",
                    shard,
                    f"index names shard {shard} ({len(expected)} tensors) but the file is missing",
                )
            )
            continue
        headers[shard] = read_header(str(shard_path))
    issues.extend(truncation_issues(headers.values()))
    tensors = indexed_tensors(weight_map, headers, issues)
    named = set(weight_map.values())
    issues.extend(
        IntegrityIssue(
            "unindexed-shard",
            extra.name,
            f"{extra.name} sits beside the index but the index does not mention it",
        )
        for extra in sorted(root.glob("*.safetensors"))
        if extra.name not in named
    )
    return tensors, issues, list(headers.values())


def indexed_tensors(
    weight_map: dict[str, str], headers: dict[str, ShardHeader], issues: list[IntegrityIssue]
) -> Mapping[str, TensorMeta]:
    """The tensors loaders see through the index; disagreements with the headers are added to
    ``issues``."""
    tensors = _as_indexed(weight_map, headers)
    return tensors if tensors is not None else _reconcile(weight_map, headers, issues)


def _as_indexed(weight_map: dict[str, str], headers: dict[str, ShardHeader]) -> TensorTable | None:
    """The usual case, checked in bulk: every shard is present and holds exactly the tensors
    the index gives it. Returns the tensors in name order, or None (then :func:`_reconcile`
    works out and words what disagrees)."""
    # Each header's names all map to that header's shard, and the counts agree: then no name
    # is in two shards, none is unindexed, and every indexed name is held (a bijection).
    if sum(len(h.columns.names) for h in headers.values()) != len(weight_map):
        return None
    for shard, header in headers.items():
        if not all(map(shard.__eq__, map(weight_map.get, header.columns.names))):
            return None
    return TensorTable.of(h.columns for h in headers.values())


def _reconcile(
    weight_map: dict[str, str], headers: dict[str, ShardHeader], issues: list[IntegrityIssue]
) -> dict[str, TensorMeta]:
    """Index and shard headers disagree: the tensors loaders would see, each issue named."""
    tensors: dict[str, TensorMeta] = {}
    holders: dict[str, list[str]] = {}
    for shard, header in headers.items():
        for name in header.tensors:
            holders.setdefault(name, []).append(shard)
    for name, shard in sorted(weight_map.items()):
        if shard not in headers:
            continue
        where = holders.get(name, [])
        if shard in where:
            tensors[name] = headers[shard].tensors[name]
        elif where:
            issues.append(
                IntegrityIssue(
                    "index-wrong-shard",
                    name,
                    f"index places {name} in {shard}, but it is in {', '.join(where)}",
                )
            )
            tensors[name] = headers[where[0]].tensors[name]
        else:
            issues.append(
                IntegrityIssue(
                    "tensor-not-in-shard", name, f"index places {name} in {shard}, which lacks it"
                )
            )
    for name, where in sorted(holders.items()):
        if len(where) > 1:
            issues.append(
                IntegrityIssue(
                    "tensor-in-two-shards", name, f"{name} is stored in {' and '.join(where)}"
                )
            )
        if name not in weight_map:
            issues.append(
                IntegrityIssue(
                    "unindexed-tensor",
                    name,
                    f"{name} is in {where[0]} but not in the index (loaders will not see it)",
                )
            )
    return tensors


def _open_unindexed(
    shards: list[Path],
) -> tuple[Mapping[str, TensorMeta], list[IntegrityIssue], list[ShardHeader]]:
    headers = [read_header(str(p)) for p in shards]
    tensors, issues = unindexed_tensors(headers)
    return tensors, [*truncation_issues(headers), *issues], headers


def unindexed_tensors(
    headers: Iterable[ShardHeader],
) -> tuple[Mapping[str, TensorMeta], list[IntegrityIssue]]:
    """Shards without an index, merged; a name stored in two shards is an issue, and the
    first shard's copy is the one loaders see."""
    headers = list(headers)
    table = TensorTable.of(h.columns for h in headers)
    if table is not None:
        return table, []
    issues: list[IntegrityIssue] = []
    tensors: dict[str, TensorMeta] = {}
    for header in headers:
        for name, meta in header.tensors.items():
            if name in tensors:
                first = Path(tensors[name].file).name
                issues.append(
                    IntegrityIssue(
                        "tensor-in-two-shards",
                        name,
                        f"{name} is stored in {first} and {Path(header.path).name}",
                    )
                )
                continue
            tensors[name] = meta
    return tensors, issues


def _few(names: list[str], shown: int = 4) -> str:
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")


def truncation_issues(headers: Iterable[ShardHeader]) -> list[IntegrityIssue]:
    """The shards whose data ends before their header says (truncated) or after it (trailing
    bytes)."""
    issues = []
    for header in headers:
        name = Path(header.path).name
        if header.truncated:
            cut = sorted(n for n, m in header.tensors.items() if not m.readable)
            issues.append(
                IntegrityIssue(
                    "truncated-shard",
                    name,
                    f"{name} is truncated: header declares {header.data_bytes_declared} data "
                    f"bytes, the file holds {header.data_bytes_on_disk} "
                    f"({len(cut)} tensors cut off: {_few(cut)})",
                )
            )
        elif header.data_bytes_on_disk > header.data_bytes_declared:
            extra = header.data_bytes_on_disk - header.data_bytes_declared
            issues.append(
                IntegrityIssue(
                    "trailing-bytes", name, f"{name} has {extra} bytes after the last tensor"
                )
            )
    return issues
