"""Positioned, bounded reads of tensor bytes."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mtpcheck.chunks import rechunk
from mtpcheck.errors import InputError, shown
from mtpcheck.model import ByteSpan, TensorMeta

_SEEK_DATA = getattr(os, "SEEK_DATA", None)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", None)


def read_tensor_chunks(meta: TensorMeta, chunk_bytes: int) -> Iterator[bytes]:
    """Yield ``meta``'s bytes from its file in order, ``chunk_bytes`` at a time."""
    if not meta.readable:
        raise InputError(meta.file, f"tensor {shown(meta.name, 200)} lies past the end of the file")
    span = ByteSpan(meta.file, meta.offset, meta.nbytes)
    yield from read_spans([span], chunk_bytes, _ended(meta))


def _ended(meta: TensorMeta) -> str:
    """What a read that meets the end of the file before the tensor's last byte says."""
    return f"file ended while reading tensor {shown(meta.name, 200)} (truncated?)"


def read_spans(
    spans: list[ByteSpan], chunk_bytes: int, truncated: str = "file ended inside a tensor"
) -> Iterator[bytes]:
    """Yield the bytes of ``spans``, one after the other, in chunks of exactly ``chunk_bytes``
    (the last may be shorter); a chunk that straddles two spans is joined."""
    return rechunk(_span_reads(spans, max(1, chunk_bytes), truncated), chunk_bytes)


def _span_reads(spans: list[ByteSpan], step: int, truncated: str) -> Iterator[bytes]:
    for span in spans:
        with _opened(span.file) as fd:
            for offset in range(span.offset, span.offset + span.length, step):
                want = min(step, span.offset + span.length - offset)
                yield _pread(fd, span.file, want, offset, truncated)


def slice_spans(spans: list[ByteSpan], start: int, length: int) -> list[ByteSpan]:
    """Bytes ``start .. start + length`` of the concatenation of ``spans``."""
    out: list[ByteSpan] = []
    for span in spans:
        if length <= 0:
            break
        if start >= span.length:
            start -= span.length
            continue
        take = min(span.length - start, length)
        out.append(ByteSpan(span.file, span.offset + start, take))
        start, length = 0, length - take
    return out


def read_spans_into(spans: list[ByteSpan], out: memoryview) -> int:
    """Read ``spans`` one after the other straight into ``out``; returns the bytes read."""
    pos = 0
    for span in spans:
        with _opened(span.file) as fd:
            done = 0
            while done < span.length:
                try:
                    n = os.preadv(fd, [out[pos + done : pos + span.length]], span.offset + done)
                except OSError as e:
                    raise InputError(span.file, e.strerror or str(e)) from e
                if n == 0:
                    raise InputError(span.file, "file ended inside a tensor")
                done += n
        pos += span.length
    return pos


SMALL_FILE_BYTES = 1 << 20
"""A tracker file or a ``metadata.json``: a few bytes to a few kilobytes."""
TEXT_FILE_BYTES = 256 << 20
"""A ``config.json``, a safetensors index or a run config: DeepSeek-V3's index is 9 MB."""


def read_text_capped(path: str | os.PathLike[str], cap: int) -> str:
    """A small text file whole, as :func:`read_capped` reads it, decoded as UTF-8 (an
    :class:`InputError` where it is not)."""
    try:
        return read_capped(path, cap).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(str(path), f"not UTF-8 text ({e.reason} at byte {e.start})") from e


def open_regular(path: str | os.PathLike[str]) -> int:
    """A descriptor of ``path`` opened for reading, refused with an :class:`InputError` where
    it is no regular file (a FIFO would block ``open``, a device never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputError(str(path), e.strerror or str(e)) from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(str(path), "not a regular file")
    return fd


def read_capped(path: str | os.PathLike[str], cap: int) -> bytes:
    """A small file whole (a pickle, a tracker, a JSON file), refused with an
    :class:`InputError` where it is no regular file or holds more than ``cap`` bytes, before
    a byte is read."""
    fd = open_regular(path)
    try:
        info = os.fstat(fd)
        if info.st_size > cap:
            raise InputError(str(path), f"{info.st_size} bytes, more than the {cap} it may hold")
        data = os.pread(fd, info.st_size + 1, 0)  # one byte more: a file that grew is seen
    except OSError as e:
        raise InputError(str(path), e.strerror or str(e)) from e
    finally:
        os.close(fd)
    if len(data) > cap:
        raise InputError(str(path), f"more than {cap} bytes")
    return data


@contextmanager
def _opened(path: str) -> Iterator[int]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    try:
        yield fd
    finally:
        os.close(fd)


def _pread(fd: int, path: str, want: int, offset: int, truncated: str) -> bytes:
    try:
        data = os.pread(fd, want, offset)
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    if len(data) != want:
        raise InputError(path, truncated)
    return data


class SpanReader:
    """Positioned reads of tensor bytes into the caller's buffers, one descriptor per file.

    Files are opened on first use and stay open until :meth:`close` (or the end of a ``with``
    block), so comparing many tensors of one shard opens it once. Reads are ``preadv`` at
    absolute offsets: threads may share a reader. The kernel's readahead is switched off for
    these descriptors (it would read up to ``read_ahead_kb`` past each tensor); the caller
    announces the ranges it is about to read with :meth:`prefetch` instead, so exactly the
    bytes compared are read from storage, in large requests.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the descriptors opened for the reads."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            with self._lock:
                fd = self._fds.get(path)
                if fd is None:
                    try:
                        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    except OSError as e:
                        raise InputError(path, e.strerror or str(e)) from e
                    _advise(fd, 0, 0, "POSIX_FADV_RANDOM")
                    self._fds[path] = fd
        return fd

    def prefetch(self, meta: TensorMeta, pos: int, n: int) -> None:
        """Ask the kernel to read the tensor's bytes ``[pos, pos + n)`` in the background."""
        _advise(self._fd(meta.file), meta.offset + pos, n, "POSIX_FADV_WILLNEED")

    def readinto(self, meta: TensorMeta, pos: int, view: memoryview) -> None:
        """Fill ``view`` with the tensor's bytes from byte ``pos`` of the tensor on."""
        fd = self._fd(meta.file)
        want = len(view)
        done = 0
        try:
            while done < want:
                n = os.preadv(fd, [view[done:]], meta.offset + pos + done)
                if n == 0:
                    raise InputError(meta.file, _ended(meta))
                done += n
        except OSError as e:
            raise InputError(meta.file, e.strerror or str(e)) from e

    def read(self, meta: TensorMeta, pos: int, n: int) -> bytes:
        """``n`` bytes of the tensor from byte ``pos`` of the tensor on."""
        fd = self._fd(meta.file)
        try:
            chunk = os.pread(fd, n, meta.offset + pos)
            while len(chunk) < n:
                more = os.pread(fd, n - len(chunk), meta.offset + pos + len(chunk))
                if not more:
                    raise InputError(meta.file, _ended(meta))
                chunk += more
        except OSError as e:
            raise InputError(meta.file, e.strerror or str(e)) from e
        return chunk

    def has_hole(self, meta: TensorMeta, pos: int, n: int) -> bool:
        """True when the tensor's bytes ``[pos, pos + n)`` include a hole (a sparse file)."""
        if _SEEK_HOLE is None or n <= 0:
            return False
        start = meta.offset + pos
        try:
            return os.lseek(self._fd(meta.file), start, _SEEK_HOLE) < start + n
        except OSError:
            return False

    def is_hole(self, meta: TensorMeta, pos: int, n: int) -> bool:
        """True when the tensor's bytes ``[pos, pos + n)`` lie in a hole of a sparse file.

        A hole reads as zero bytes, so two holes hold equal bytes without reading them. False
        whenever in doubt (no ``SEEK_DATA``, a file system without hole reporting, errors).
        """
        if _SEEK_DATA is None or n <= 0:
            return False
        fd = self._fd(meta.file)
        start = meta.offset + pos
        try:
            if os.lseek(fd, start, _SEEK_DATA) < start + n:
                return False
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no data at or after ``start``
                return False
        try:  # a range past the end of the file is not a hole but missing bytes
            return os.fstat(fd).st_size >= start + n
        except OSError:
            return False


def _advise(fd: int, offset: int, length: int, advice: str) -> None:
    """``posix_fadvise``, where the platform has it; advice only, so failures are ignored."""
    code = getattr(os, advice, None)
    if code is None or not hasattr(os, "posix_fadvise"):
        return
    try:
        os.posix_fadvise(fd, offset, length, code)
    except OSError:
        pass
