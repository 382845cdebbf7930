"""Hand freed heap memory back to the system between the stages of a long run.

glibc keeps memory that Python and numpy free inside its heap when it lies between blocks still
in use (buffers of up to its adaptive mmap threshold, 32 MiB, come from the heap once a larger
one was freed), so a conversion stage that handled 100 MiB tensors leaves the process that much
larger for the stages after it. ``malloc_trim(0)`` returns every whole free page of the heap.
Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
