"""The chunking contract of ``Checkpoint.read_chunks``: every chunk exactly ``chunk_bytes``
long except the last, so two streams of the same tensor line up chunk for chunk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def rechunk(chunks: Iterable[Any], size: int) -> Iterator[bytes]:
    """``chunks`` (bytes-like) re-cut to exactly ``size`` bytes each, the last possibly
    shorter; ``bytes`` chunks of that size pass through uncopied. Always ``bytes`` out: they
    compare with ``memcmp`` (a memoryview compares element by element, ~10x slower)."""
    size = max(1, size)
    pending = bytearray()
    for chunk in chunks:
        if not pending and len(chunk) == size:
            yield chunk if isinstance(chunk, bytes) else bytes(chunk)
            continue
        pending += chunk
        while len(pending) >= size:
            yield bytes(pending[:size])
            del pending[:size]
    if pending:
        yield bytes(pending)
