"""Context for a changed dtype: do the values survive it?

A tensor whose dtype changed is never bit-identical (bytes, dtype and shape decide), but a
converter that stores BF16 weights as F32 keeps every value, while one that rounds F32 to
BF16 does not. Widening is exact between these float types, so the narrower side is widened
to the wider one and the bits compared: the count of values that differ is reported beside
the verdict, never as one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import itemsize
from mtpcheck.model import Checkpoint

if TYPE_CHECKING:
    import numpy as np

_EXACT_WIDER = {"BF16": ("F32", "F64"), "F16": ("F32", "F64"), "F32": ("F64",)}
"""Float types each of whose values the wider types hold exactly."""
_CHUNK_ELEMENTS = 1 << 20


def comparable(narrow: str, wide: str) -> bool:
    return wide in _EXACT_WIDER.get(narrow, ())


def widen(raw: np.ndarray, narrow: str, wide: str) -> np.ndarray:
    """Bits of ``raw`` (unsigned ints of ``narrow``'s width) as ``wide``'s bits, exactly."""
    import numpy as np

    if narrow == "BF16":  # the top half of a float32
        as32 = raw.astype(np.uint32) << 16
        if wide == "F32":
            return as32
        return as32.view(np.float32).astype(np.float64).view(np.uint64)
    source = {"F16": np.float16, "F32": np.float32}[narrow]
    target, bits = {"F32": (np.float32, np.uint32), "F64": (np.float64, np.uint64)}[wide]
    with np.errstate(invalid="ignore"):
        return raw.view(source).astype(target).view(bits)


def values_differing(a: Checkpoint, an: str, b: Checkpoint, bn: str) -> int | None:
    """Elements of two same-shape tensors of different float types whose values differ once
    the narrower is widened exactly; None when the two types are not such a pair. Streams both
    tensors in step, a bounded number of elements at a time."""
    import numpy as np

    ma, mb = a.tensors[an], b.tensors[bn]
    if ma.shape != mb.shape or not (ma.readable and mb.readable):
        return None
    swapped = comparable(mb.dtype, ma.dtype)
    if not (swapped or comparable(ma.dtype, mb.dtype)):
        return None
    (cn, nn, mn), (cw, nw, mw) = (
        ((b, bn, mb), (a, an, ma)) if swapped else ((a, an, ma), (b, bn, mb))
    )
    wn, ww = itemsize(mn.dtype), itemsize(mw.dtype)
    assert wn is not None and ww is not None
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    differing = 0
    chunks = zip(
        _chunks(cn, nn, wn * _CHUNK_ELEMENTS), _chunks(cw, nw, ww * _CHUNK_ELEMENTS), strict=True
    )
    for narrow, wide in chunks:
        widened = widen(np.frombuffer(narrow, dtype=uint[wn]), mn.dtype, mw.dtype)
        differing += int(np.count_nonzero(widened != np.frombuffer(wide, dtype=uint[ww])))
    return differing


def _chunks(ckpt: Checkpoint, name: str, size: int) -> Iterator[bytes]:
    return rechunk(ckpt.read_chunks(name, size), size)
