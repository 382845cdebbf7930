"""Context for a changed dtype: do the values survive it?

A tensor whose dtype changed is never bit-identical (bytes, dtype and shape decide), but a
converter that stores BF16 weights as F32 keeps every value, while one that rounds F32 to
BF16 does not. Widening is exact between these float types, so the narrower side is widened
to the wider one and the bits compared: the count of values that differ is reported beside
the verdict, never as one.
"""

from __future__ import annotations

from collections.abc import Iterator

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import exact_wider, is_high_precision, itemsize
from mtpcheck.model import Checkpoint

_CHUNK_ELEMENTS = 1 << 20


def values_differing(a: Checkpoint, an: str, b: Checkpoint, bn: str) -> int | None:
    """Elements of two same-shape tensors of different float types whose values differ once
    the narrower is widened exactly; None when the two types are not such a pair. Streams both
    tensors in step, a bounded number of elements at a time."""
    import numpy as np

    from mtpcheck.mapping.transforms import widen  # numpy: only here

    ma, mb = a.tensors[an], b.tensors[bn]
    if ma.shape != mb.shape or not (ma.readable and mb.readable):
        return None
    swapped = ma.dtype in exact_wider(mb.dtype)
    if not (swapped or mb.dtype in exact_wider(ma.dtype)):
        return _values_differing_across(a, an, b, bn)
    (cn, nn, mn), (cw, nw, mw) = (
        ((b, bn, mb), (a, an, ma)) if swapped else ((a, an, ma), (b, bn, mb))
    )
    wn, ww = itemsize(mn.dtype), itemsize(mw.dtype)
    assert wn is not None and ww is not None
    differing = 0
    chunks = zip(
        _chunks(cn, nn, wn * _CHUNK_ELEMENTS), _chunks(cw, nw, ww * _CHUNK_ELEMENTS), strict=True
    )
    for narrow, wide in chunks:
        widened = widen(np.frombuffer(narrow, dtype=f"<u{wn}"), mn.dtype, mw.dtype)
        differing += int(np.count_nonzero(widened != np.frombuffer(wide, dtype=f"<u{ww}")))
    return differing


def _chunks(ckpt: Checkpoint, name: str, size: int) -> Iterator[bytes]:
    return rechunk(ckpt.read_chunks(name, size), size)


def _values_differing_across(a: Checkpoint, an: str, b: Checkpoint, bn: str) -> int | None:
    """Elements whose values differ between two float types neither of which holds the other's
    every value (BF16 and F16): both decoded to float64 and the bits compared, so a kept value
    counts as kept, the sign of a zero included; None where a side is no float type read."""
    import numpy as np

    from mtpcheck.mapping.transforms import decode  # numpy: only here

    ma, mb = a.tensors[an], b.tensors[bn]
    if not (is_high_precision(ma.dtype) and is_high_precision(mb.dtype)):
        return None
    wa, wb = itemsize(ma.dtype), itemsize(mb.dtype)
    assert wa is not None and wb is not None
    differing = 0
    chunks = zip(
        _chunks(a, an, wa * _CHUNK_ELEMENTS), _chunks(b, bn, wb * _CHUNK_ELEMENTS), strict=True
    )
    for left, right in chunks:
        va = decode(np.frombuffer(left, dtype=f"<u{wa}"), ma.dtype).view("<u8")
        vb = decode(np.frombuffer(right, dtype=f"<u{wb}"), mb.dtype).view("<u8")
        differing += int(np.count_nonzero(va != vb))
    return differing
