"""Memory that maps a file as it is, by address: what a writer can copy file to file instead.

The HF -> Megatron converter hands megatron-core's writer tensors that are private maps of the
source shards (a plain copy needs no other memory). :class:`FileRanges` maps them and keeps,
for each live map, where its bytes lie in which file, so the writer can ask "are these bytes
in memory a file's?" and copy them with ``copy_file_range`` instead of writing them from
memory (:class:`mtpcheck.convert.torch_dist_writer._KernelCopyStream`).

A map is registered only while nothing writes into it: the converter never does (the maps are
copy-on-write, and only read), and takes each one out of the registry when it frees it.
"""

from __future__ import annotations

import mmap
import os
import threading


def buffer_address(view: memoryview) -> int:
    """The address of a contiguous buffer's first byte, read-only buffers included."""
    import numpy as np

    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def map_private(fd: int, offset: int, nbytes: int) -> memoryview:
    """``nbytes`` of the open file ``fd`` from ``offset`` as a private copy-on-write map
    (nothing read until touched; pages shared with the page cache). Raises ``OSError`` or
    ``ValueError`` where the file cannot be mapped."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fd, offset - start + nbytes, access=mmap.ACCESS_COPY, offset=start)
    return memoryview(mapped)[offset - start :]


class FileRanges:
    """Live private maps of files, each known by its address range (thread-safe).

    Calling it with ``(address, length)`` answers ``(descriptor, offset)`` when those bytes are
    wholly inside one live map, else None (the writer's ``FileBytes``). :meth:`close` closes
    the descriptors; the maps themselves live as long as their users.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[int, tuple[int, int, int]] = {}
        """Start address -> (length, descriptor, offset in the file)."""
        self._fds: dict[str, int] = {}

    def map(self, path: str, offset: int, nbytes: int) -> memoryview | None:
        """:func:`map_private`, registered; None where the file cannot be mapped."""
        try:
            fd = self._descriptor(path)
            raw = map_private(fd, offset, nbytes)
        except (OSError, ValueError):  # e.g. a file system without mmap: the caller reads it
            return None
        with self._lock:
            self._ranges[buffer_address(raw)] = (nbytes, fd, offset)
        return raw

    def _descriptor(self, path: str) -> int:
        """One descriptor per file, for the maps and the copies alike (the same file)."""
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return fd

    def forget(self, raw: memoryview) -> None:
        """Take a map out of the registry (before its pages are freed or it is reused)."""
        with self._lock:
            self._ranges.pop(buffer_address(raw), None)

    def __call__(self, address: int, length: int) -> tuple[int, int] | None:
        with self._lock:
            for start, (size, fd, offset) in self._ranges.items():
                if start <= address and address + length <= start + size:
                    return fd, offset + (address - start)
        return None

    def close(self) -> None:
        """Close every descriptor opened so far and forget the registered maps."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._ranges.clear()
