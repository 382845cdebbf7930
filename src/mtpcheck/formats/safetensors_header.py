"""Parse and validate a safetensors header without importing torch or safetensors.

Only the 8-byte length prefix and the JSON header are read; tensor data stays on disk.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from array import array
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from math import prod
from operator import attrgetter, itemgetter, mul, sub
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from mtpcheck.dtypes import BITS_BY_DTYPE
from mtpcheck.errors import HeaderError, shown
from mtpcheck.model import TensorColumns, TensorMeta

MAX_HEADER_BYTES = 100_000_000
"""The safetensors format caps its JSON header at 100 MB."""
MAX_DATA_END = 1 << 62
"""No file holds this many bytes; offsets beyond it are refused (they are kept as int64)."""

_DTYPES = {d: d for d in BITS_BY_DTYPE}  # one shared string per dtype code
_Size = Annotated[int, msgspec.Meta(ge=0)]  # a JSON integer >= 0 (a bool is refused)


@dataclass(frozen=True)
class ShardHeader:
    """The parsed header of one safetensors file."""

    path: str
    columns: TensorColumns
    metadata: dict[str, str]
    data_bytes_declared: int
    data_bytes_on_disk: int

    @property
    def truncated(self) -> bool:
        """True when the file holds fewer data bytes than the header declares."""
        return self.data_bytes_on_disk < self.data_bytes_declared

    @cached_property
    def tensors(self) -> dict[str, TensorMeta]:
        """Each tensor's metadata, in header order (built on first use)."""
        c = self.columns
        return {name: c.meta(i, name) for i, name in enumerate(c.names)}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate tensor name {shown(key, 200)}")
        out[key] = value
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


GIT_LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
"""How a Git LFS pointer file starts: what a checkout without ``git lfs`` leaves in place of a
shard (its first 8 bytes read as a header length far past the limit)."""


def parse_header_bytes(path: str, prefix: bytes, header: bytes, file_size: int) -> ShardHeader:
    """Validate a header given its raw bytes; pure, so it can be fuzzed directly."""
    if len(prefix) < 8:
        raise HeaderError(path, f"file is {file_size} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n == 0:
        raise HeaderError(path, "header length is 0")
    if prefix[:8] == GIT_LFS_POINTER[:8]:
        raise HeaderError(
            path, "a Git LFS pointer, not the file's content (fetch it: git lfs pull)"
        )
    if n > MAX_HEADER_BYTES:
        raise HeaderError(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size or len(header) < n:
        raise HeaderError(path, f"header length {n} runs past the end of the {file_size}-byte file")
    body = header[:n]
    if not body.isascii():  # ASCII is UTF-8: the usual header is decoded from its bytes alone
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise HeaderError(path, f"header is not UTF-8 ({e.reason} at byte {e.start})") from e
    fast = parse_common(path, body, 8 + n, file_size)
    if fast is not None:
        return fast
    return _parse_careful(path, body.decode("utf-8"), 8 + n, file_size)


def _parse_careful(path: str, text: str, data_start: int, file_size: int) -> ShardHeader:
    """Tensor by tensor, naming the first fault found."""
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise HeaderError(path, f"header is not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise HeaderError(path, f"header is JSON {type(raw).__name__}, expected an object")

    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise HeaderError(path, "__metadata__ is not an object")
    entries = [_tensor_entry(path, name, entry) for name, entry in raw.items()]
    declared = _check_layout(
        path, [(b, e, name) for (b, e, _, _), name in zip(entries, raw, strict=True)]
    )
    if data_start + declared > MAX_DATA_END:
        raise HeaderError(path, f"data_offsets declare {declared} bytes, more than a file holds")
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    columns = TensorColumns(
        file=path,
        file_size=file_size,
        names=list(raw),
        dtypes=[_DTYPES[d] for _, _, d, _ in entries],
        shapes=[shapes.setdefault(s, s) for _, _, _, s in entries],
        offsets=array("q", [data_start + b for b, _, _, _ in entries]),
        sizes=array("q", [e - b for b, e, _, _ in entries]),
    )
    return ShardHeader(
        path=path,
        columns=columns,
        metadata={str(k): str(v) for k, v in metadata.items()},
        data_bytes_declared=declared,
        data_bytes_on_disk=max(file_size - data_start, 0),
    )


if TYPE_CHECKING:
    _Dtype = str
else:  # msgspec checks the code as it parses and gives the one string object of each code
    _Dtype = Literal[tuple(BITS_BY_DTYPE)]


class _Entry(msgspec.Struct, gc=False):
    """A header entry as the fast parse decodes it: a field left at its default was absent.
    Unknown keys are skipped (the colon count in :func:`parse_common` then refuses the
    header)."""

    dtype: _Dtype = ""
    shape: tuple[_Size, ...] | None = None
    data_offsets: tuple[_Size, _Size] | None = None


class _Metadata(msgspec.Struct, gc=False):
    """Only the ``__metadata__`` object of a header; the entries are skipped unparsed."""

    metadata: dict[str, str] = msgspec.field(name="__metadata__", default_factory=dict)


_ENTRIES = msgspec.json.Decoder(dict[str, _Entry])
_METADATA = msgspec.json.Decoder(_Metadata)
_STRINGS = msgspec.json.Decoder(dict[str, str])
_METADATA_FIRST = b'{"__metadata__":{'
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
_OFFSETS = attrgetter("data_offsets")
_BEGIN = itemgetter(0)
_END = itemgetter(1)


def parse_common(
    path: str, text: str | bytes, data_start: int, file_size: int
) -> ShardHeader | None:
    """The usual header, parsed fast from its UTF-8 bytes (or its text): the same result as
    the careful parse, or None whenever anything is unusual (it then decides, and words the
    error).

    Accepted: a top-level object whose entries are objects of exactly ``dtype``, ``shape`` and
    ``data_offsets`` with valid values, and an optional ``__metadata__`` object of strings,
    in a text without backslashes (escapes are left to the careful parse, so that the two
    parsers never have to agree on decoding one). msgspec decodes the entries straight into
    typed records, checking the dtype codes and the types and signs of the sizes as it
    parses, and the columns are built with ``map`` (no Python-level loop per tensor:
    DeepSeek-V3's 163 headers hold 92k).

    Duplicate keys and keys beyond the three are ruled out by counting colons: a decoded object
    keeps the last of duplicate keys and skips unknown ones silently, but every key-value pair
    in the text has its colon, so a text whose colons number exactly the keys decoded held no
    other pair anywhere (and no colon inside a string).
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    if b"\\" in data:
        return None
    try:
        raw = _ENTRIES.decode(data)
        keys = len(raw)
        has_metadata = raw.pop("__metadata__", None) is not None
        metadata = _metadata_of(data) if has_metadata else {}
    except (ValueError, RecursionError):  # msgspec's errors are ValueErrors
        return None
    if data.count(b":") != keys + 3 * len(raw) + len(metadata):
        return None
    columns = _entry_columns(list(raw.values()), data_start)
    if columns is None:
        return None
    dtypes, shapes, offsets, sizes, declared = columns
    if data_start + declared > MAX_DATA_END:
        return None
    return ShardHeader(
        path=path,
        columns=TensorColumns(
            file=path,
            file_size=file_size,
            names=list(raw),
            dtypes=dtypes,
            shapes=shapes,
            offsets=array("q", offsets),
            sizes=array("q", sizes),
        ),
        metadata=metadata,
        data_bytes_declared=declared,
        data_bytes_on_disk=max(file_size - data_start, 0),
    )


def _metadata_of(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` object of a header without backslashes. Where it opens the header
    (as safetensors writes it) it is decoded from its own bytes, up to the first ``}``: no
    string can hold a quote, so that brace either closes the object (whose values are strings)
    or falls inside a string the slice then leaves open, which the decoder refuses; otherwise,
    or then, from the whole header (the entries skipped unparsed)."""
    if data.startswith(_METADATA_FIRST):
        end = data.find(b"}", len(_METADATA_FIRST))
        try:
            return _STRINGS.decode(data[len(_METADATA_FIRST) - 1 : end + 1])
        except ValueError:
            pass
    return _METADATA.decode(data).metadata


def _entry_columns(
    entries: list[_Entry], data_start: int
) -> tuple[list[str], list[tuple[int, ...]], list[int], list[int], int] | None:
    """(dtypes, shapes, absolute offsets, sizes, data bytes) of the entries, or None when one
    lacks a field, spans other than its shape's bytes, or they do not tile the data section.
    Column by column with ``map`` (no Python-level loop per tensor); msgspec has already
    checked the dtype codes and that sizes and offsets are ints >= 0."""
    if not entries:
        return [], [], [], [], 0
    try:  # a field left at its default: None is not subscriptable or iterable, "" no code
        dtypes: list[str] = list(map(_DTYPE, entries))
        shapes: list[tuple[int, ...]] = list(map(_SHAPE, entries))
        spans = list(map(_OFFSETS, entries))
        begins: list[int] = list(map(_BEGIN, spans))
        ends: list[int] = list(map(_END, spans))
        bits = list(map(mul, map(BITS_BY_DTYPE.__getitem__, dtypes), map(prod, shapes)))
    except (TypeError, KeyError):
        return None
    sizes = list(map(sub, ends, begins))
    # bits of the shape == 8 * the span's bytes (which also rules out end < begin)
    if bits != list(map(mul, sizes, repeat(8))):
        return None
    if begins[0] == 0 and begins[1:] == ends[:-1]:  # stored in header order, back to back
        declared = ends[-1]
    else:
        declared = 0
        for begin, size in sorted(zip(begins, sizes, strict=True)):
            if begin != declared:
                return None
            declared = begin + size
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct shape
    shapes = list(map(shared.setdefault, shapes, shapes))
    return dtypes, shapes, list(map(data_start.__add__, begins)), sizes, declared


def _tensor_entry(path: str, name: str, entry: object) -> tuple[int, int, str, tuple[int, ...]]:
    if not isinstance(entry, dict):
        raise HeaderError(path, f"tensor {shown(name, 200)}: entry is not an object")
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in BITS_BY_DTYPE:
        raise HeaderError(path, f"tensor {shown(name, 200)}: unknown dtype {shown(dtype, 200)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise HeaderError(
            path, f"tensor {shown(name, 200)}: shape {shown(shape, 200)} is not a list of sizes"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise HeaderError(
            path,
            f"tensor {shown(name, 200)}: data_offsets {shown(offsets, 200)} are not [begin, end]",
        )
    numel = 1
    for d in shape:
        numel *= d
    bits = numel * BITS_BY_DTYPE[dtype]
    begin, end = offsets
    if bits % 8 or bits // 8 != end - begin:
        raise HeaderError(
            path,
            f"tensor {shown(name, 200)}: {dtype}{shape} needs {bits / 8:g} bytes "
            f"but data_offsets span {end - begin}",
        )
    return begin, end, dtype, tuple(shape)


def _check_layout(path: str, spans: list[tuple[int, int, str]]) -> int:
    """Tensors must tile the data section exactly: no overlaps, no holes."""
    position = 0
    for begin, end, name in sorted(spans):
        if begin < position:
            raise HeaderError(path, f"tensor {shown(name, 200)}: data overlaps the previous tensor")
        if begin > position:
            raise HeaderError(
                path, f"tensor {shown(name, 200)}: {begin - position}-byte hole before it"
            )
        position = end
    return position


def read_header(path: str) -> ShardHeader:
    """Read and validate the header of the safetensors file at ``path``."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise HeaderError(
                    path, "Is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
                )
            size = st.st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                return parse_header_bytes(path, prefix, b"", size)
            (n,) = struct.unpack("<Q", prefix)
            header = f.read(n) if 0 < n <= min(MAX_HEADER_BYTES, size) else b""
    except OSError as e:
        raise HeaderError(path, e.strerror or str(e)) from e
    return parse_header_bytes(path, prefix, header, size)
