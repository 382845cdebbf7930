"""Write a checkpoint as Hugging Face sharded safetensors, one tensor at a time.

Headers are computed from tensor metadata first, so each shard is written front to back
while tensor bytes stream through in bounded chunks: peak memory is one tensor's worth at
most (less for tensors that are plain copies), never the checkpoint. Tensors whose bytes lie
in files as they are (the checkpoint's ``byte_spans(name)``) are copied file to file inside
the kernel.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from mtpcheck.errors import InputError
from mtpcheck.model import ByteSpan, HasByteSpans, TensorMeta
from mtpcheck.ticker import Ticker

DEFAULT_SHARD_BYTES = 4 * 1024**3
CHUNK_BYTES = 16 * 1024 * 1024


def _plan_shards(metas: list[TensorMeta], shard_bytes: int) -> list[list[TensorMeta]]:
    shards: list[list[TensorMeta]] = [[]]
    size = 0
    for meta in metas:
        if shards[-1] and size + meta.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(meta)
        size += meta.nbytes
    return shards


def _copy_span(span: ByteSpan, dst_fd: int) -> int:
    """Append ``span``'s bytes to ``dst_fd``, copied inside the kernel where it can
    (``copy_file_range``, as ``cp`` does: no trip through user space), else read and written
    in bounded chunks. Returns the bytes copied."""
    with open(span.file, "rb") as src:
        done = 0
        while done < span.length:
            count = min(span.length - done, 1 << 30)
            try:
                n = os.copy_file_range(src.fileno(), dst_fd, count, span.offset + done)
            except (AttributeError, OSError):  # no such call, or not across these files
                n = _copy_by_reading(src.fileno(), dst_fd, span.offset + done, count)
            if n == 0:
                where = span.offset + done
                raise InputError(span.file, f"file ended inside a tensor at byte {where}")
            done += n
    return done


def _copy_by_reading(src_fd: int, dst_fd: int, offset: int, count: int) -> int:
    data = os.pread(src_fd, min(count, CHUNK_BYTES), offset)
    view = memoryview(data)
    while view:
        view = view[os.write(dst_fd, view) :]
    return len(data)


def _header(metas: list[TensorMeta]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for meta in metas:
        header[meta.name] = {
            "dtype": meta.dtype,
            "shape": list(meta.shape),
            "data_offsets": [offset, offset + meta.nbytes],
        }
        offset += meta.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    return blob + b" " * (-len(blob) % 8)


class TensorSource(Protocol):
    """What :func:`write_hf` reads: any :class:`~mtpcheck.model.Checkpoint`, or a converter's
    view of one whose chunks are views of its buffers (written as they are, never copied)."""

    @property
    def tensors(self) -> Mapping[str, TensorMeta]:
        """Every tensor to write, by its HF name."""
        ...

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        """The tensor's bytes in C order, ``chunk_bytes`` at a time."""
        ...


def write_hf(
    ckpt: TensorSource,
    dst: Path,
    config: Mapping[str, Any] | None = None,
    names: list[str] | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    durable: bool = True,
    ticker: Ticker | None = None,
) -> list[Path]:
    """Write ``names`` (default: all) of ``ckpt`` under ``dst``; returns the shard paths.

    Each shard is ``fsync``ed unless ``durable=False`` (a checkpoint read back and deleted).
    ``ticker`` is told each tensor written.
    """
    dst.mkdir(parents=True, exist_ok=True)
    byte_spans = ckpt.byte_spans if isinstance(ckpt, HasByteSpans) else None
    metas = [ckpt.tensors[n] for n in sorted(names if names is not None else ckpt.tensors)]
    shards = _plan_shards(metas, shard_bytes)
    total = len(shards)
    files = []
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        name = (
            "model.safetensors" if total == 1 else f"model-{number:05d}-of-{total:05d}.safetensors"
        )
        path = dst / name
        blob = _header(shard)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for meta in shard:
                spans = byte_spans(meta.name) if byte_spans is not None else None
                if spans is not None and sum(s.length for s in spans) == meta.nbytes:
                    f.flush()
                    written = sum(_copy_span(span, f.fileno()) for span in spans)
                    f.seek(0, os.SEEK_END)
                else:
                    written = 0
                    for chunk in ckpt.read_chunks(meta.name, CHUNK_BYTES):
                        f.write(chunk)
                        written += len(chunk)
                if written != meta.nbytes:
                    raise ValueError(
                        f"{meta.name}: produced {written} bytes, expected {meta.nbytes}"
                    )
                if ticker is not None:
                    ticker.advance(written, meta.name)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        weight_map.update({meta.name: name for meta in shard})
        files.append(path)
    if total > 1:
        index = {
            "metadata": {"total_size": sum(m.nbytes for m in metas)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if config is not None:
        (dst / "config.json").write_text(json.dumps(dict(config), indent=2, sort_keys=True) + "\n")
    return files
