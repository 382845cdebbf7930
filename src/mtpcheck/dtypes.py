"""Element types: one registry, keyed by the safetensors dtype code, of everything mtpcheck
knows about each (width, kind, torch and numpy names, torch's storage class, every float's bit
layout, the block of block-quantized types). Every other module asks here instead of keeping a
table of its own: how a float's bits decode, its grid step, which wider floats hold its every
value, which types ``accept`` computes in."""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache


class Kind(str, enum.Enum):
    """What an element of a type is: how its bits read as a value."""

    FLOAT = "float"
    """A binary float: its :class:`FloatLayout` decodes it."""
    INT = "int"
    """A two's-complement integer."""
    UINT = "uint"
    """An unsigned integer (also the packed words of sub-byte quantized weights)."""
    BOOL = "bool"
    """One byte, zero or one."""
    COMPLEX = "complex"
    """A pair of floats (real, imaginary)."""
    BLOCK = "block"
    """Block-quantized: ``block`` elements share one record of ``block_bytes`` bytes (their
    quants and scales together), so no element has a width of its own (GGUF ``Q4_K``)."""


class Specials(str, enum.Enum):
    """Which codes of a float format are not numbers."""

    IEEE = "ieee"
    """The top exponent holds infinities (mantissa zero) and NaNs (IEEE 754, OCP E5M2)."""
    FN = "fn"
    """No infinities; one NaN code per sign, every exponent and mantissa bit set (OCP E4M3,
    E8M0)."""
    NONE = "none"
    """Every code is a finite number (OCP MX FP4 and FP6)."""


@dataclass(frozen=True)
class FloatLayout:
    """Sign, exponent and mantissa of a binary float format: what decoding its bits, its grid
    step and which formats hold its every value follow from."""

    exponent_bits: int
    mantissa_bits: int
    bias: int
    specials: Specials = Specials.IEEE
    signed: bool = True
    """False for E8M0 (scales: a power of two, no sign bit)."""
    subnormals: bool = True
    """False for E8M0: a zero exponent is ``2 ** -bias``, not a subnormal."""

    @property
    def min_exponent(self) -> int:
        """The exponent of the smallest normal value (below it the step stops shrinking)."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """The exponent of the top exponent code (an upper bound of the finite values')."""
        return (1 << self.exponent_bits) - 1 - self.bias

    def holds(self, narrow: FloatLayout) -> bool:
        """Whether this format holds every value of ``narrow`` exactly (signs, infinities and
        NaNs included: IEEE formats only on this side)."""
        return (
            self.specials is Specials.IEEE
            and self.signed >= narrow.signed
            and self.mantissa_bits >= narrow.mantissa_bits
            and self.max_exponent >= narrow.max_exponent
            and self.min_exponent - self.mantissa_bits <= narrow.min_exponent - narrow.mantissa_bits
        )

    def value(self, code: int) -> float:
        """The value of the element whose bits are ``code`` (NaN for every NaN code)."""
        exp_bits, man_bits, bias = self.exponent_bits, self.mantissa_bits, self.bias
        top = (1 << exp_bits) - 1
        sign = -1.0 if self.signed and code >> (exp_bits + man_bits) & 1 else 1.0
        exp = (code >> man_bits) & top
        man = code & ((1 << man_bits) - 1)
        if self.specials is Specials.FN and exp == top and man == (1 << man_bits) - 1:
            return math.nan
        if self.specials is Specials.IEEE and exp == top:
            return math.inf * sign if man == 0 else math.nan
        if exp == 0 and self.subnormals:
            return sign * man * 2.0 ** (1 - bias - man_bits)
        return sign * (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias)


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
    """Every float's bit layout (None for the other kinds)."""
    struct_char: str | None = None
    """The :mod:`struct` format character of a float Python unpacks itself."""
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
_E8M0 = FloatLayout(8, 0, 127, Specials.FN, signed=False, subnormals=False)
_BF16 = FloatLayout(8, 7, 127)

DTYPES: Mapping[str, DType] = {
    d.code: d
    for d in (
        DType("BOOL", 8, Kind.BOOL, "bool", "bool", "BoolStorage"),
        DType("U8", 8, _U, "uint8", "uint8", "ByteStorage"),
        DType("I8", 8, _I, "int8", "int8", "CharStorage"),
        DType("F8_E5M2", 8, _F, "float8_e5m2", layout=FloatLayout(5, 2, 15)),
        DType("F8_E4M3", 8, _F, "float8_e4m3fn", layout=FloatLayout(4, 3, 7, Specials.FN)),
        DType("F8_E8M0", 8, _F, "float8_e8m0fnu", layout=_E8M0),
        DType("I16", 16, _I, "int16", "int16", "ShortStorage"),
        DType("U16", 16, _U, "uint16", "uint16"),
        DType("F16", 16, _F, "float16", "float16", "HalfStorage", FloatLayout(5, 10, 15), "e"),
        DType("BF16", 16, _F, "bfloat16", storage="BFloat16Storage", layout=_BF16),
        DType("I32", 32, _I, "int32", "int32", "IntStorage"),
        DType("U32", 32, _U, "uint32", "uint32"),
        DType("F32", 32, _F, "float32", "float32", "FloatStorage", FloatLayout(8, 23, 127), "f"),
        DType("I64", 64, _I, "int64", "int64", "LongStorage"),
        DType("U64", 64, _U, "uint64", "uint64"),
        DType("F64", 64, _F, "float64", "float64", "DoubleStorage", FloatLayout(11, 52, 1023), "d"),
        DType("C64", 64, Kind.COMPLEX, "complex64", "complex64", "ComplexFloatStorage"),
        DType("F4", 4, _F, layout=FloatLayout(2, 1, 1, Specials.NONE)),
        DType("F6_E2M3", 6, _F, layout=FloatLayout(2, 3, 1, Specials.NONE)),
        DType("F6_E3M2", 6, _F, layout=FloatLayout(3, 2, 3, Specials.NONE)),
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

COMPUTE_DTYPES = ("F32", "BF16", "F16")
"""The float types ``accept`` can run the MTP layers (and main model) in."""
COMPUTE_DTYPE_CHOICES: tuple[str, ...] = (
    "auto",
    *(d.torch for c in COMPUTE_DTYPES if (d := DTYPES[c]).torch),
)
"""``accept --dtype``: ``auto`` or a compute type by its torch name (``bfloat16``)."""

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
    layout = dtype.layout if dtype is not None else None
    return dtype is not None and dtype.bits == 8 and layout is not None and layout.signed


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


def float_layout(code: str) -> FloatLayout | None:
    """The bit layout of float dtype ``code``; None for any other (or unknown) dtype."""
    dtype = DTYPES.get(code)
    return dtype.layout if dtype is not None else None


@cache
def exact_wider(narrow: str) -> tuple[str, ...]:
    """The unquantized float types (16 bits and more) wider than ``narrow`` that hold each of
    its values exactly, narrowest first: where a converter may widen a tensor bit for bit."""
    layout = float_layout(narrow)
    if layout is None or not is_high_precision(narrow):
        return ()
    return tuple(
        d.code
        for d in sorted(DTYPES.values(), key=lambda d: d.bits)
        if d.layout is not None
        and d.bits > DTYPES[narrow].bits
        and is_high_precision(d.code)
        and d.layout.holds(layout)
    )


@cache
def top_bits_of(code: str) -> tuple[str, int] | None:
    """For a float numpy cannot hold that is the top bits of one it can (BF16 of F32): that
    type and the shift that widens one to the other, bit for bit; else None."""
    dtype = DTYPES.get(code)
    if dtype is None or dtype.layout is None or dtype.numpy is not None:
        return None
    mine = dtype.layout
    for wide in DTYPES.values():
        other = wide.layout
        if wide.numpy is None or other is None or wide.bits <= dtype.bits:
            continue
        same_range = (other.exponent_bits, other.bias, other.signed, other.specials) == (
            mine.exponent_bits,
            mine.bias,
            mine.signed,
            mine.specials,
        )
        if same_range and other.mantissa_bits - mine.mantissa_bits == wide.bits - dtype.bits:
            return wide.code, wide.bits - dtype.bits
    return None


@cache
def code_values(code: str) -> tuple[float, ...]:
    """The value of every bit pattern of a float of at most 8 bits, by pattern (a table the
    array decoders index with the stored codes)."""
    dtype = DTYPES[code]
    if dtype.layout is None or dtype.bits > 8:
        raise KeyError(code)
    return tuple(dtype.layout.value(c) for c in range(1 << dtype.bits))


def unpack_floats(data: bytes, code: str) -> Sequence[float]:
    """The values of little-endian elements of float ``code`` in ``data``, decoded in Python
    (no numpy: ``inspect`` stays light); ``KeyError`` for a type Python does not unpack."""
    widened = top_bits_of(code)
    if widened is not None:  # BF16: its bytes are the top of a float32's, the rest zero
        width = DTYPES[code].bits // 8
        wide, shift = widened
        wide_width = DTYPES[wide].bits // 8
        out = bytearray(len(data) // width * wide_width)
        for i in range(width):
            out[shift // 8 + i :: wide_width] = data[i::width]
        data, code = bytes(out), wide
    char = DTYPES[code].struct_char
    if char is None:
        raise KeyError(code)
    return struct.unpack(f"<{len(data) // struct.calcsize(char)}{char}", data)
