"""Context for a changed dtype: do the values survive it?

A tensor whose dtype changed is never bit-identical (bytes, dtype and shape decide), but a
converter that stores BF16 weights as F32 keeps every value, while one that rounds F32 to
BF16 does not. Where one float type holds every value of the other, the narrower side is
widened exactly and the bits compared; between two that do not (BF16 and F16) each side is
decoded to float64. The count of values that differ decides how the change is reported: none
is a warning (not the same bytes, no value lost), any a failure
(:func:`mtpcheck.checks.findings.status_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import exact_wider, is_high_precision, itemsize
from mtpcheck.model import Checkpoint

if TYPE_CHECKING:
    import numpy as np

_CHUNK_ELEMENTS = 1 << 20


def values_differing(a: Checkpoint, an: str, b: Checkpoint, bn: str) -> int | None:
    """Elements of two same-shape tensors of different float types whose values differ: the
    narrower widened exactly where one type holds every value of the other, else (BF16 and
    F16) both decoded to float64 and the bits compared, so a kept value counts as kept, the
    sign of a zero included; None where a side is no float type read. Streams both tensors in
    step, a bounded number of elements at a time."""
    import numpy as np

    ma, mb = a.tensors[an], b.tensors[bn]
    if ma.shape != mb.shape or not (ma.readable and mb.readable):
        return None
    count = _counter(ma.dtype, mb.dtype)
    wa, wb = itemsize(ma.dtype), itemsize(mb.dtype)
    if count is None or wa is None or wb is None:
        return None
    chunks = zip(
        _chunks(a, an, wa * _CHUNK_ELEMENTS), _chunks(b, bn, wb * _CHUNK_ELEMENTS), strict=True
    )
    return sum(
        count(np.frombuffer(left, dtype=f"<u{wa}"), np.frombuffer(right, dtype=f"<u{wb}"))
        for left, right in chunks
    )


Counter = Callable[["np.ndarray", "np.ndarray"], int]


def _counter(da: str, db: str) -> Counter | None:
    """How to count the differing values of a chunk of ``da`` bits against one of ``db``."""
    import numpy as np

    from mtpcheck.mapping.transforms import decode, widen  # numpy: only here

    if db in exact_wider(da):
        return lambda x, y: int(np.count_nonzero(widen(x, da, db) != y))
    if da in exact_wider(db):
        return lambda x, y: int(np.count_nonzero(x != widen(y, db, da)))
    if is_high_precision(da) and is_high_precision(db):
        return lambda x, y: int(
            np.count_nonzero(decode(x, da).view("<u8") != decode(y, db).view("<u8"))
        )
    return None


def _chunks(ckpt: Checkpoint, name: str, size: int) -> Iterator[bytes]:
    return rechunk(ckpt.read_chunks(name, size), size)
