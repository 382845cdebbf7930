"""Safetensors dtype codes and their element widths in bits."""

from __future__ import annotations

BITS_BY_DTYPE: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


def itemsize(dtype: str) -> int | None:
    """Bytes per element, or None for sub-byte dtypes."""
    bits = BITS_BY_DTYPE[dtype]
    return bits // 8 if bits % 8 == 0 else None
