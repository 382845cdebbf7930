"""Where the raw bytes of a ``torch.save``-d tensor lie, found without torch and without
loading the tensor.

A ``torch.save`` file (and each tensor chunk of a torch.distributed.checkpoint ``.distcp``
file, which is one such blob at a byte range) is an uncompressed zip: ``<prefix>/data.pkl``
describes the tensor (storage key, dtype, offset, shape, strides), ``<prefix>/data/<key>`` holds
the storage's elements as raw little-endian bytes, ``<prefix>/byteorder`` says which. For a
plain contiguous tensor those bytes are the tensor in C order, so they can be read by offset in
bounded chunks straight from the file, with no intermediate blob and no second copy.

:func:`locate_tensor` reads only the zip directory, the local header of the record and the
small pickle, which is interpreted by an allowlist that builds no object at all. Anything else
(a compressed or big-endian record, another pickle, a strided view, a storage too short) gives
``None``: the caller then loads the blob with torch as before, which words any error.
"""

from __future__ import annotations

import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mtpcheck.dtypes import BY_STORAGE, BY_TORCH, DType

MAX_PICKLE_BYTES = 64 * 1024
"""A tensor's ``data.pkl`` is ~160 bytes; anything much larger is not a plain tensor."""

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class RawTensor:
    """A tensor's bytes in C order: ``nbytes`` at ``offset`` of the file."""

    dtype: str
    """safetensors dtype name."""
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class _NotPlain(Exception):
    """The blob is not a plain tensor record this module reads by offset."""


@dataclass(frozen=True)
class _Storage:
    dtype: str | None
    """None for an untyped (byte) storage: the tensor names its dtype."""
    itemsize: int
    key: str
    numel: int


@dataclass(frozen=True)
class _Rebuilt:
    dtype: str
    itemsize: int
    storage: _Storage
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(
    storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any
) -> _Rebuilt:
    if not isinstance(storage, _Storage) or storage.dtype is None:
        raise _NotPlain("tensor without a typed storage")
    return _Rebuilt(
        storage.dtype, storage.itemsize, storage, _int(storage_offset), _ints(size), _ints(stride)
    )


def _rebuild_tensor_v3(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    hooks: Any,
    dtype: Any,
    *rest: Any,
) -> _Rebuilt:
    if not isinstance(storage, _Storage) or storage.dtype is not None:
        raise _NotPlain("tensor without an untyped storage")
    if not isinstance(dtype, _DtypeName):
        raise _NotPlain(f"dtype {dtype!r}")
    width = dtype.itemsize
    elements = _Storage(dtype.dtype, width, storage.key, storage.numel // width)
    if storage.numel % width:
        raise _NotPlain("byte storage not a whole number of elements")
    return _Rebuilt(dtype.dtype, width, elements, _int(storage_offset), _ints(size), _ints(stride))


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _NotPlain(f"not a non-negative int: {value!r}")
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise _NotPlain(f"not a tuple: {value!r}")
    return tuple(_int(v) for v in value)


class _StorageType:
    def __init__(self, dtype: str | None, itemsize: int) -> None:
        self.dtype, self.itemsize = dtype, itemsize


class _DtypeName:
    """A ``torch.<dtype>`` global of ``_rebuild_tensor_v3`` (dtypes without a typed storage
    class, e.g. float8, are saved with an untyped byte storage)."""

    def __init__(self, dtype: DType) -> None:
        self.dtype, self.itemsize = dtype.code, dtype.itemsize


class _Describer(pickle.Unpickler):
    """Reads a tensor's ``data.pkl`` into a :class:`_Rebuilt`; any other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("torch._utils", "_rebuild_tensor_v3"):
            return _rebuild_tensor_v3
        if module == "torch" and name in BY_STORAGE:  # a typed storage class
            return _StorageType(BY_STORAGE[name].code, BY_STORAGE[name].itemsize)
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _StorageType(None, 1)
        if module == "torch" and name in BY_TORCH and BY_TORCH[name].itemsize:
            return _DtypeName(BY_TORCH[name])
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise _NotPlain(f"global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotPlain(f"persistent id {pid!r}")
        kind, key, numel = pid[1], pid[2], pid[4]
        if not isinstance(kind, _StorageType) or not isinstance(key, str):
            raise _NotPlain(f"storage {pid!r}")
        return _Storage(kind.dtype, kind.itemsize, key, _int(numel))


class _Window:
    """``length`` bytes of a file at ``start``, as a read-only seekable file (positioned reads,
    the descriptor's own offset untouched)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        left = max(0, self.length - self.pos)
        n = left if n is None or n < 0 else min(n, left)
        data = os.pread(self.fd, n, self.start + self.pos) if n else b""
        self.pos += len(data)
        return data


def locate_tensor(fd: int, start: int, length: int) -> RawTensor | None:
    """The tensor ``torch.save``-d at bytes ``start..start+length`` of ``fd``, by offset;
    None when it is not a plain contiguous little-endian tensor record."""
    window = _Window(fd, start, length)
    try:
        with zipfile.ZipFile(window) as archive:  # type: ignore[arg-type]
            return _locate(archive, window)
    except (
        _NotPlain,
        zipfile.BadZipFile,
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        struct.error,
    ):
        return None  # not plain, or malformed: torch's loader words any error


def _locate(archive: zipfile.ZipFile, window: _Window) -> RawTensor:
    by_name = {info.filename: info for info in archive.infolist()}
    for info in by_name.values():
        if info.CRC == 0:  # torch wrote no checksum (torch.serialization.set_crc32_options)
            info.CRC = None  # type: ignore[assignment]  # zipfile then checks none
    pickles = [n for n in by_name if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pickles) != 1:
        raise _NotPlain("no single data.pkl")
    prefix = pickles[0][: -len("data.pkl")]
    order = by_name.get(prefix + "byteorder")
    if order is None or order.file_size > 16 or archive.read(order) != b"little":
        raise _NotPlain("not little-endian")
    info = by_name[pickles[0]]
    if info.file_size > MAX_PICKLE_BYTES:
        raise _NotPlain("data.pkl too large")
    described = _describe(archive.read(info))
    storage = described.storage
    record = by_name.get(f"{prefix}data/{storage.key}")
    if record is None or record.compress_type != zipfile.ZIP_STORED:
        raise _NotPlain("storage record missing or compressed")
    if record.file_size != storage.numel * storage.itemsize:
        raise _NotPlain("storage record size")
    if record.file_size > window.length:
        raise _NotPlain("storage record larger than the blob")
    numel = math.prod(described.shape)
    if described.storage_offset + numel > storage.numel or not _c_contiguous(described):
        raise _NotPlain("not a contiguous view of its storage")
    data_start = _data_start(window, record)
    if data_start + record.file_size > window.length:
        raise _NotPlain("record past the blob")
    return RawTensor(
        dtype=described.dtype,
        shape=described.shape,
        offset=window.start + data_start + described.storage_offset * storage.itemsize,
        nbytes=numel * storage.itemsize,
    )


def _describe(blob: bytes) -> _Rebuilt:
    import io

    described = _Describer(io.BytesIO(blob)).load()
    if not isinstance(described, _Rebuilt):
        raise _NotPlain("data.pkl is not one tensor")
    return described


def _c_contiguous(t: _Rebuilt) -> bool:
    if len(t.stride) != len(t.shape):
        return False
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride), strict=True):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def _data_start(window: _Window, record: zipfile.ZipInfo) -> int:
    """Offset of the record's bytes in the blob: after its local header, whose extra field
    (torch pads it to align the data) may differ from the central directory's."""
    window.seek(record.header_offset)
    header = window.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise _NotPlain("local header cut short")
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != _LOCAL_MAGIC:
        raise _NotPlain("bad local header")
    name_len, extra_len = fields[9], fields[10]
    return record.header_offset + _LOCAL_HEADER.size + name_len + extra_len
