"""The zip archive of a ``torch.save`` file, read without torch.

A ``torch.save`` file (and each tensor chunk or common-state blob of a
torch.distributed.checkpoint ``.distcp`` file, which is one such archive at a byte range) is a
zip: ``<prefix>/data.pkl`` is the pickle, ``<prefix>/data/<key>`` holds each storage's elements
as raw little-endian bytes, ``<prefix>/byteorder`` says which. torch writes the records
uncompressed, so a storage's bytes lie at a fixed offset of the file: :class:`Archive` reads
them there by position when a tensor's elements are used (not mapped: a file that shrinks
while read is an error, not SIGBUS), and inflates a record only where a writer compressed it,
up to :data:`MAX_RATIO` times its stored size.

What the pickle may name is :mod:`mtpcheck.formats.safe_pickle`'s business; this module knows
the container only.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mtpcheck.errors import shown, shown_text
from mtpcheck.formats.chunked_read import open_regular
from mtpcheck.formats.torch_pickle import StorageRef, TorchReadError

MAX_PICKLE_BYTES = 256 * 1024 * 1024
"""A ``data.pkl`` is kilobytes (a rank file's args and key names); more is not a checkpoint."""

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"


class _Window(io.RawIOBase):
    """``length`` bytes of a file at ``start``, as a read-only seekable file (positioned reads,
    the descriptor's own offset untouched)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.length)[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self.length - self.pos)
        n = left if n is None or n < 0 else min(n, left)
        data = os.pread(self.fd, n, self.start + self.pos) if n else b""
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class Archive:
    """One ``torch.save`` archive: its pickle, and its storages' bytes by key.

    ``path`` with an optional ``(start, length)`` window, or ``blob`` (named ``path`` in
    errors). Raises :class:`TorchReadError` for an archive it cannot read (the caller names the
    file); :class:`OSError` passes through.
    """

    def __init__(
        self,
        path: str | Path,
        window: tuple[int, int] | None = None,
        blob: bytes | None = None,
        fd: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._records: dict[str, zipfile.ZipInfo] = {}
        self._blob = blob
        self._own_fd = False
        self._fd: int | None = None
        self._span = (0, len(blob) if blob is not None else 0)
        if blob is not None:
            self._file: _Window | io.BytesIO = io.BytesIO(blob)
        else:
            if fd is None:
                fd, self._own_fd = open_regular(path), True
            self._fd = fd
            size = os.fstat(fd).st_size
            start, length = window if window else (0, size)
            if start + length > size:
                if self._own_fd:
                    os.close(fd)
                raise TorchReadError(
                    f"file ended inside the archive at bytes {start}..{start + length}"
                )
            self._span = (start, length)
            self._file = _Window(fd, start, length)
        try:
            self._zip = self._open_zip()
            self.prefix = self._prefix()
        except (zipfile.BadZipFile, EOFError, KeyError, ValueError, struct.error) as e:
            self.close()
            if isinstance(e, TorchReadError):
                raise
            raise TorchReadError(f"malformed zip archive ({e})") from e
        except BaseException:
            self.close()
            raise

    def _open_zip(self) -> zipfile.ZipFile:
        try:
            archive = zipfile.ZipFile(self._file)
        except zipfile.BadZipFile as e:
            raise TorchReadError(
                "not a zip archive (torch.save files from before torch 1.6 are not read)"
            ) from e
        for info in archive.infolist():
            if info.filename in self._records:  # readers differ on which one they take
                raise TorchReadError(f"two records named {shown(info.filename)} (ambiguous)")
            self._records[info.filename] = info
            if info.CRC == 0:  # torch wrote no checksum (torch.serialization.set_crc32_options)
                info.CRC = None  # type: ignore[assignment]  # zipfile then checks none
        return archive

    def _prefix(self) -> str:
        pickles = [n for n in self._records if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise TorchReadError("no single <name>/data.pkl record")
        prefix = pickles[0][: -len("data.pkl")]
        order = self._records.get(prefix + "byteorder")
        if order is not None and (order.file_size > 16 or self._read(order) != b"little"):
            raise TorchReadError("a big-endian torch.save file (not read)")
        return prefix

    def pickle_bytes(self, max_bytes: int | None = None) -> bytes:
        """The archive's ``data.pkl``; :class:`TorchReadError` past ``max_bytes`` (default
        :data:`MAX_PICKLE_BYTES`)."""
        info = self._records[self.prefix + "data.pkl"]
        if info.file_size > (max_bytes or MAX_PICKLE_BYTES):
            raise TorchReadError(f"data.pkl is {info.file_size} bytes")
        return self._read(info)

    def _read(self, info: zipfile.ZipInfo, source: zipfile.ZipFile | None = None) -> bytes:
        """A record's bytes, inflated where compressed: refused past :data:`MAX_RATIO` times
        its stored size, and read no further than the size it declares."""
        _check_ratio(info)
        try:
            with (source or self._zip).open(info) as record:
                data = record.read(info.file_size + 1)
        except (RuntimeError, NotImplementedError, zipfile.BadZipFile, EOFError, zlib.error) as e:
            raise TorchReadError(f"record {shown(info.filename)}: {shown_text(str(e))}") from e
        if len(data) != info.file_size:
            raise TorchReadError(f"record {shown(info.filename)} is not its declared size")
        return data

    def close(self) -> None:
        """Close the zip and the file; storages stay readable (:meth:`storage` opens the file
        again, by its path)."""
        if getattr(self, "_zip", None) is not None:
            self._zip.close()
        if self._own_fd and self._fd is not None:
            os.close(self._fd)
        self._fd = None

    # --- storages (StorageBytes) --------------------------------------------------------------

    def offset(self, key: str) -> int | None:
        """Where storage ``key``'s bytes start in the file (window included); None where the
        record is compressed or the archive is a blob in memory."""
        info = self._record(key)
        if info.compress_type != zipfile.ZIP_STORED or isinstance(self._file, io.BytesIO):
            return None
        return self._file.start + self._data_start(info)

    def check(self, storage: StorageRef) -> None:
        """Raise :class:`TorchReadError` unless the storage's record holds its bytes."""
        width = storage.dtype.itemsize if storage.dtype else 1
        nbytes = storage.numel * (width or 0)
        size = self.record_size(storage.key)
        if size != nbytes:
            raise TorchReadError(f"storage {storage.key} holds {size} bytes, not {nbytes}")

    def record_size(self, key: str) -> int:
        """Bytes of storage ``key``'s record."""
        return self._record(key).file_size

    def storage(self, key: str) -> Any:
        """Storage ``key``'s bytes, a flat uint8 array (its size is held to the pickle's by
        :meth:`check` while loading). A file's are read again from the file, by position:
        a file that shrank since it was opened gives a :class:`TorchReadError`, never a
        memory-mapped page past its end (SIGBUS)."""
        info = self._record(key)
        if self._blob is not None:
            return self._storage_of(info, io.BytesIO(self._blob))
        fd = open_regular(self.path)
        try:
            start, length = self._span
            if os.fstat(fd).st_size < start + length:
                raise TorchReadError("the file shrank since it was opened (is it being written?)")
            return self._storage_of(info, _Window(fd, start, length))
        finally:
            os.close(fd)

    def _storage_of(self, info: zipfile.ZipInfo, source: _Window | io.BytesIO) -> Any:
        if info.compress_type != zipfile.ZIP_STORED:
            try:
                with zipfile.ZipFile(source) as again:
                    return np.frombuffer(self._read(info, again), dtype=np.uint8)
            except (zipfile.BadZipFile, EOFError, ValueError) as e:
                raise TorchReadError(f"storage {info.filename}: {shown_text(str(e))}") from e
        source.seek(self._data_start(info, source))
        data = source.read(info.file_size)
        if len(data) != info.file_size:
            raise TorchReadError(f"storage {info.filename} ends past the end of the file")
        return np.frombuffer(data, dtype=np.uint8)

    def _record(self, key: str) -> zipfile.ZipInfo:
        info = self._records.get(f"{self.prefix}data/{key}")
        if info is None:
            raise TorchReadError(f"storage {key} has no record")
        return info

    def _data_start(self, info: zipfile.ZipInfo, source: _Window | io.BytesIO | None = None) -> int:
        """Offset of the record's bytes in the archive: after its local header, whose extra
        field (torch pads it to align the data) may differ from the central directory's."""
        at = info.header_offset
        source = source if source is not None else self._file
        source.seek(at)
        header = source.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size:
            raise TorchReadError(f"record {info.filename} cut short")
        fields = _LOCAL_HEADER.unpack(header)
        if fields[0] != _LOCAL_MAGIC:
            raise TorchReadError(f"bad local header of {info.filename}")
        name_length, extra_length = int(fields[9]), int(fields[10])
        return at + _LOCAL_HEADER.size + name_length + extra_length


MAX_RATIO = 64
"""How many times its stored size a compressed record may inflate to. torch stores records
uncompressed; a writer that compresses tensor data gets a ratio near 1, and a record claiming
more is refused rather than inflated (what a read costs stays a multiple of what it read)."""


def _check_ratio(info: zipfile.ZipInfo) -> None:
    if info.compress_type != zipfile.ZIP_STORED and info.file_size > max(
        4096, MAX_RATIO * info.compress_size
    ):
        raise TorchReadError(
            f"record {shown(info.filename)} inflates from {info.compress_size} to "
            f"{info.file_size} bytes, more than {MAX_RATIO} times"
        )
