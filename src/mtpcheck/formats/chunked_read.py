"""Positioned, bounded reads of tensor bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator

from mtpcheck.errors import InputError
from mtpcheck.model import TensorMeta


def read_tensor_chunks(meta: TensorMeta, chunk_bytes: int) -> Iterator[bytes]:
    """Yield ``meta``'s bytes from its file in order, at most ``chunk_bytes`` at a time."""
    if not meta.readable:
        raise InputError(meta.file, f"tensor {meta.name!r} lies past the end of the file")
    try:
        fd = os.open(meta.file, os.O_RDONLY)
    except OSError as e:
        raise InputError(meta.file, e.strerror or str(e)) from e
    try:
        done = 0
        while done < meta.nbytes:
            want = min(chunk_bytes, meta.nbytes - done)
            chunk = os.pread(fd, want, meta.offset + done)
            if len(chunk) != want:
                raise InputError(
                    meta.file, f"file ended while reading tensor {meta.name!r} (truncated?)"
                )
            done += want
            yield chunk
    except OSError as e:
        raise InputError(meta.file, e.strerror or str(e)) from e
    finally:
        os.close(fd)
