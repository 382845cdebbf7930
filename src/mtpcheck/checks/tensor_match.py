"""Bit-for-bit tensor comparison: raw bytes, dtype and shape decide; nothing else.

Bytes are streamed in bounded chunks. Only when two chunks differ is numpy used to count
the differing elements and, as context, the largest absolute difference.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from mtpcheck.dtypes import itemsize
from mtpcheck.model import Checkpoint, TensorComparison, TensorMeta, TensorStatus

if TYPE_CHECKING:
    import numpy as np

CHUNK_BYTES = 16 * 1024 * 1024


def compare(
    a: Checkpoint, a_name: str, b: Checkpoint, b_name: str, chunk_bytes: int = CHUNK_BYTES
) -> TensorComparison:
    """Compare tensor ``a_name`` of ``a`` with ``b_name`` of ``b``."""
    ma = a.tensors.get(a_name)
    mb = b.tensors.get(b_name)
    label = a_name if a_name == b_name else f"{a_name} ~ {b_name}"
    if ma is None or mb is None:
        status = TensorStatus.MISSING if mb is None else TensorStatus.EXTRA
        return TensorComparison(
            name=label,
            status=status,
            dtype=(ma.dtype if ma else None, mb.dtype if mb else None),
            shape=(ma.shape if ma else None, mb.shape if mb else None),
            nbytes=(ma or mb).nbytes if (ma or mb) else 0,
        )
    base = TensorComparison(
        name=label,
        status=TensorStatus.EQUAL,
        dtype=(ma.dtype, mb.dtype),
        shape=(ma.shape, mb.shape),
        nbytes=ma.nbytes,
    )
    if ma.dtype != mb.dtype:
        return replace(base, status=TensorStatus.DTYPE_CHANGED)
    if ma.shape != mb.shape:
        return replace(base, status=TensorStatus.SHAPE_CHANGED)
    if not (ma.readable and mb.readable):
        return replace(base, status=TensorStatus.UNREADABLE)
    left = a.read_chunks(a_name, chunk_bytes)
    right = b.read_chunks(b_name, chunk_bytes)
    return _compare_bytes(base, ma, left, right)


def _compare_bytes(
    base: TensorComparison, meta: TensorMeta, left: Iterator[bytes], right: Iterator[bytes]
) -> TensorComparison:
    width = itemsize(meta.dtype)
    size = width or 1
    differing = 0
    first: int | None = None
    max_diff: float | None = None
    position = 0
    for ca, cb in zip(left, right, strict=True):
        if ca != cb:
            count, first_here, diff = _diff_chunk(ca, cb, size, meta.dtype)
            differing += count
            if first is None:
                first = position // size + first_here
            if diff is not None and (max_diff is None or diff > max_diff):
                max_diff = diff
        position += len(ca)
    if first is None:
        return base
    return replace(
        base,
        status=TensorStatus.BITS_DIFFER,
        differing_elements=differing,
        first_difference=_unravel(first, meta.shape, byte_index=width is None),
        max_abs_diff=max_diff,
    )


def _unravel(flat: int, shape: tuple[int, ...], byte_index: bool) -> tuple[int, ...]:
    if byte_index or not shape:
        return (flat,)
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(index))


def _diff_chunk(ca: bytes, cb: bytes, width: int, dtype: str) -> tuple[int, int, float | None]:
    """Count differing elements of two equal-length chunks; context value on the side."""
    import numpy as np

    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    ra = np.frombuffer(ca, dtype=uint)
    rb = np.frombuffer(cb, dtype=uint)
    mask = ra != rb
    where = np.flatnonzero(mask)
    diff = _max_abs_diff(ra[mask], rb[mask], dtype)
    return int(where.size), int(where[0]), diff


def _max_abs_diff(ra: np.ndarray, rb: np.ndarray, dtype: str) -> float | None:
    va = _as_float(ra, dtype)
    vb = _as_float(rb, dtype)
    if va is None or vb is None:
        return None
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(va - vb)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return None
    value = float(d.max())
    return value if math.isfinite(value) else None


def _as_float(raw: np.ndarray, dtype: str) -> np.ndarray | None:
    import numpy as np

    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    simple = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
    ints = {"I8": np.int8, "U8": np.uint8, "I16": np.int16, "U16": np.uint16, "I32": np.int32}
    ints.update({"U32": np.uint32, "I64": np.int64, "U64": np.uint64})
    if dtype in simple:
        return raw.view(simple[dtype]).astype(np.float64)
    if dtype in ints:
        return raw.view(ints[dtype]).astype(np.float64)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        return _fp8_table(dtype)[raw]
    return None


def _fp8_table(dtype: str) -> np.ndarray:
    """All 256 values of an OCP FP8 format (E4M3 'fn' without infinities, or E5M2)."""
    import numpy as np

    exp_bits, man_bits, bias = (4, 3, 7) if dtype == "F8_E4M3" else (5, 2, 15)
    values = np.empty(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp = (code >> man_bits) & ((1 << exp_bits) - 1)
        man = code & ((1 << man_bits) - 1)
        if dtype == "F8_E4M3" and exp == 15 and man == 7:
            values[code] = math.nan
        elif dtype == "F8_E5M2" and exp == 31:
            values[code] = math.inf * sign if man == 0 else math.nan
        elif exp == 0:
            values[code] = sign * man * 2.0 ** (1 - bias - man_bits)
        else:
            values[code] = sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)
    return values
