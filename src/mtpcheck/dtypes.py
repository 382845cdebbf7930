"""Element types: one registry, keyed by the safetensors dtype code, of everything mtpcheck
knows about each (width, kind, torch and numpy names, torch's storage class, the float layout
of the small floats, the block of block-quantized types). Every other module asks here
instead of keeping a table of its own."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Kind(str, enum.Enum):
    FLOAT = "float"
    INT = "int"
    UINT = "uint"
    BOOL = "bool"
    COMPLEX = "complex"
    BLOCK = "block"
    """Block-quantized: ``block`` elements share one record of ``block_bytes`` bytes (their
    quants and scales together), so no element has a width of its own (GGUF ``Q4_K``)."""


@dataclass(frozen=True)
class FloatLayout:
    """Sign, exponent and mantissa of a small float format (decoded bit by bit)."""

    exponent_bits: int
    mantissa_bits: int
    bias: int
    finite_only: bool
    """OCP "fn" formats: no infinities, one NaN code per sign (all exponent and mantissa bits
    set); otherwise IEEE-style: the top exponent holds infinities and NaNs."""


@dataclass(frozen=True)
class DType:
    """One element type."""

    code: str
    """The safetensors code (``BF16``, ``F8_E4M3``): what :class:`~mtpcheck.model.TensorMeta`
    carries."""
    bits: int
    """Bits per element (for a block type, the bits of one block over its elements, rounded
    down: what a table of sizes shows, not a width to read by)."""
    kind: Kind
    torch: str | None = None
    """``torch.<name>``, where torch has the type."""
    numpy: str | None = None
    """The numpy type holding the values, where numpy has one (not bfloat16, not FP8)."""
    storage: str | None = None
    """torch's typed-storage class, as ``torch.save`` pickles it (legacy checkpoints); types
    without one (FP8) are pickled with an untyped byte storage and their ``torch`` name."""
    layout: FloatLayout | None = None
    """For floats numpy cannot hold: how to decode their bits."""
    block: int = 1
    """Elements stored together in one record; 1 for element types."""
    block_bytes: int = 0
    """Bytes of one record of a block type (0 for element types)."""

    @property
    def itemsize(self) -> int | None:
        """Bytes per element; None when an element is not a whole number of bytes (sub-byte
        and block types)."""
        if self.block != 1:
            return None
        return self.bits // 8 if self.bits % 8 == 0 else None

    def nbytes(self, numel: int) -> int | None:
        """Bytes ``numel`` elements take; None when they do not fill whole records."""
        if self.block != 1:
            blocks, rest = divmod(numel, self.block)
            return None if rest else blocks * self.block_bytes
        bits = numel * self.bits
        return bits // 8 if bits % 8 == 0 else None


def _gguf(code: str, block: int, block_bytes: int) -> DType:
    """A GGML block type (``ggml-common.h``: ``QK4_0`` elements to a ``block_q4_0`` record)."""
    return DType(code, block_bytes * 8 // block, Kind.BLOCK, block=block, block_bytes=block_bytes)


_F, _I, _U = Kind.FLOAT, Kind.INT, Kind.UINT

DTYPES: Mapping[str, DType] = {
    d.code: d
    for d in (
        DType("BOOL", 8, Kind.BOOL, "bool", "bool", "BoolStorage"),
        DType("U8", 8, _U, "uint8", "uint8", "ByteStorage"),
        DType("I8", 8, _I, "int8", "int8", "CharStorage"),
        DType(
            "F8_E5M2",
            8,
            _F,
            "float8_e5m2",
            layout=FloatLayout(5, 2, 15, finite_only=False),
        ),
        DType(
            "F8_E4M3",
            8,
            _F,
            "float8_e4m3fn",
            layout=FloatLayout(4, 3, 7, finite_only=True),
        ),
        DType("F8_E8M0", 8, _F, "float8_e8m0fnu"),
        DType("I16", 16, _I, "int16", "int16", "ShortStorage"),
        DType("U16", 16, _U, "uint16", "uint16"),
        DType("F16", 16, _F, "float16", "float16", "HalfStorage"),
        DType("BF16", 16, _F, "bfloat16", storage="BFloat16Storage"),
        DType("I32", 32, _I, "int32", "int32", "IntStorage"),
        DType("U32", 32, _U, "uint32", "uint32"),
        DType("F32", 32, _F, "float32", "float32", "FloatStorage"),
        DType("I64", 64, _I, "int64", "int64", "LongStorage"),
        DType("U64", 64, _U, "uint64", "uint64"),
        DType("F64", 64, _F, "float64", "float64", "DoubleStorage"),
        DType("C64", 64, Kind.COMPLEX, "complex64", "complex64", "ComplexFloatStorage"),
        DType("F4", 4, _F),
        DType("F6_E2M3", 6, _F),
        DType("F6_E3M2", 6, _F),
        # GGML block types, by their ``ggml_type`` names; no safetensors file holds them
        _gguf("Q4_0", 32, 18),
        _gguf("Q4_1", 32, 20),
        _gguf("Q5_0", 32, 22),
        _gguf("Q5_1", 32, 24),
        _gguf("Q8_0", 32, 34),
        _gguf("Q2_K", 256, 84),
        _gguf("Q3_K", 256, 110),
        _gguf("Q4_K", 256, 144),
        _gguf("Q5_K", 256, 176),
        _gguf("Q6_K", 256, 210),
    )
}

BITS_BY_DTYPE: Mapping[str, int] = {
    code: d.bits for code, d in DTYPES.items() if d.kind is not Kind.BLOCK
}
"""Bits per element of each element type (the safetensors header parser's hot loop reads
this; a safetensors header naming a block type is malformed)."""

BY_TORCH: Mapping[str, DType] = {d.torch: d for d in DTYPES.values() if d.torch}
BY_STORAGE: Mapping[str, DType] = {d.storage: d for d in DTYPES.values() if d.storage}


def itemsize(code: str) -> int | None:
    """Bytes per element of dtype ``code``; None for sub-byte and block dtypes and for a code
    the registry lacks (a reader's ``torch.<name>`` for a torch dtype it does not know):
    such tensors are compared byte by byte."""
    dtype = DTYPES.get(code)
    return dtype.itemsize if dtype is not None else None


def is_high_precision(code: str) -> bool:
    """Whether ``code`` is a float of 16 bits or more: how a model's weights are stored when
    nothing quantized them (a weight of any other type is a quantized one)."""
    dtype = DTYPES.get(code)
    return dtype is not None and dtype.kind is Kind.FLOAT and dtype.bits >= 16


def is_fp8(code: str) -> bool:
    """Whether ``code`` is an FP8 weight type (E4M3, E5M2: one-byte floats with a sign and a
    mantissa), the storage of FP8-quantised weights; E8M0 holds only scales."""
    dtype = DTYPES.get(code)
    return dtype is not None and dtype.bits == 8 and dtype.layout is not None


def torch_name(code: str) -> str:
    """The ``torch.<name>`` of ``code``; ``KeyError`` where torch has no such type."""
    name = DTYPES[code].torch
    if name is None:
        raise KeyError(code)
    return name


def safetensors_code(torch_dtype: object) -> str:
    """The code of a torch dtype (or its name); an unknown one keeps its torch name
    (``torch.foo``), which no check will take for a known dtype."""
    name = str(torch_dtype).removeprefix("torch.")
    dtype = BY_TORCH.get(name)
    return dtype.code if dtype is not None else f"torch.{name}"
