"""One decoder per quantized layout (:class:`~mtpcheck.params.encodings.Encoding`): the
values a quantized parameter holds, a block of rows at a time, each with the spacing of its
grid there (the step ``diff --dequantize`` measures in).

Each layout is read as its writer's own code lays it out (the layouts are described on
:class:`~mtpcheck.params.encodings.Encoding`); a matrix is ``[out, in]``, as the
full-precision original stores it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mtpcheck.checks.tensor_match import as_float
from mtpcheck.dtypes import DTYPES, code_values
from mtpcheck.mapping.views import load_array
from mtpcheck.model import Checkpoint
from mtpcheck.params import LogicalParam, Role, Scheme
from mtpcheck.params.encodings import Encoding

ROWS = 256
"""Rows dequantized at a time."""


class Chunk(NamedTuple):
    """Rows of the matrix dequantized, with what measuring them against the original needs."""

    rows: slice
    values: np.ndarray
    steps: np.ndarray
    """The grid step at each value."""
    slack: np.ndarray | float = 0.0
    """Error the rounding of the stored scale, offset and result explains, for a quantizer that
    computes in their low-precision type (mlx-lm's affine layout in BF16): not counted."""
    outward: np.ndarray | None = None
    """+1 / -1 where a value is the last point of its grid upward / downward (a float grid's
    largest level), 0 elsewhere: an original beyond it was clipped, and is measured from it."""


def float_outward(levels: np.ndarray, grid: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """:attr:`Chunk.outward` of values ``levels * scale`` on a symmetric float grid whose
    levels are ``grid``: its largest finite level, either sign."""
    top = np.abs(grid[np.isfinite(grid)]).max(initial=0.0)
    edge: np.ndarray = np.where(np.abs(levels) == top, np.sign(levels) * np.sign(scale), 0.0)
    return edge


def int_outward(codes: np.ndarray, bits: int, scale: np.ndarray) -> np.ndarray:
    """:attr:`Chunk.outward` of an integer grid whose codes run from 0 to ``2**bits - 1``
    (before any offset or zero point): its first and last code, in the scale's direction."""
    top = (1 << bits) - 1
    edge: np.ndarray = np.where(codes == top, 1.0, np.where(codes == 0, -1.0, 0.0))
    directed: np.ndarray = edge * np.sign(scale)
    return directed


def half_ulp(values: np.ndarray, code: str) -> np.ndarray:
    """Half a unit in the last place of each value in float type ``code`` (the most rounding
    to that type moves it)."""
    layout = DTYPES[code].layout
    assert layout is not None
    exponent = np.floor(np.log2(np.maximum(np.abs(values), np.finfo(np.float64).tiny)))
    exponent = np.maximum(exponent, layout.min_exponent)
    half: np.ndarray = np.exp2(exponent - layout.mantissa_bits - 1)
    return half


class NotDequantized(Exception):
    """A layout or a tensor this module does not read (the reason is the message)."""


class Malformed(NotDequantized):
    """A layout this module reads, whose stored parts do not fit together (a side part
    missing, a scale or index that does not cover the matrix, an unreadable quant state):
    no loader could rebuild the weight either."""


def read_floats(ckpt: Checkpoint, name: str) -> np.ndarray:
    """A stored float (or integer) tensor's values as float64."""
    values = as_float(load_array(ckpt, name), ckpt.tensors[name].dtype)
    if values is None:
        raise NotDequantized(f"{name}: {ckpt.tensors[name].dtype} values cannot be read")
    return values


@dataclass(frozen=True)
class Stored:
    """The stored parts of one quantized parameter, read on demand."""

    ckpt: Checkpoint
    param: LogicalParam
    scheme: Scheme

    def name(self, role: Role) -> str | None:
        """The stored tensor holding ``role``, if the checkpoint has it."""
        name = self.param.part(role)
        return name if name is not None and name in self.ckpt.tensors else None

    def need(self, role: Role) -> str:
        """The stored tensor holding ``role``; :class:`NotDequantized` without one."""
        name = self.name(role)
        if name is None:
            raise Malformed(f"{self.param.name}: no {role.value} stored")
        return name

    def raw(self, role: Role) -> np.ndarray:
        """The part's bits, as unsigned ints of its element width."""
        return load_array(self.ckpt, self.need(role))

    def floats(self, role: Role) -> np.ndarray:
        """The part's values as float64."""
        return read_floats(self.ckpt, self.need(role))

    def dtype(self, role: Role) -> str:
        """The part's stored dtype."""
        return self.ckpt.tensors[self.need(role)].dtype

    @property
    def values(self) -> str:
        """The stored tensor holding the values."""
        values = self.param.values
        assert values is not None  # an encoding is only found for a parameter with values
        return values


def blocks(out: int) -> Iterator[slice]:
    """The output rows, :data:`ROWS` at a time."""
    for start in range(0, out, ROWS):
        yield slice(start, min(out, start + ROWS))


def expand(
    scale: np.ndarray, rows: slice, shape: tuple[int, int], block: tuple[int, ...] | None = None
) -> np.ndarray:
    """``scale`` (per tensor, row, group of columns or block) broadcast over ``rows``."""
    out, cols = shape
    s = scale.reshape(1, 1) if scale.size == 1 else scale.reshape(scale.shape[0], -1)
    r, c = s.shape
    bo = block[0] if block and len(block) == 2 else math.ceil(out / r)
    bi = block[1] if block and len(block) == 2 else math.ceil(cols / c)
    row_index = np.arange(rows.start, rows.stop) // bo
    col_index = np.arange(cols) // bi
    if row_index.max(initial=0) >= r or col_index.max(initial=0) >= c:
        raise Malformed(f"a scale of shape {list(scale.shape)} does not cover {list(shape)}")
    expanded: np.ndarray = s[row_index][:, col_index]
    return expanded


def unpack_bits(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unsigned ``bits``-bit integers packed densely into each row of ``words`` (unsigned
    ints), element ``i`` at bit ``i * bits`` of the row's little-endian bit stream: how
    compressed-tensors, GPTQ (3-bit included), mlx-lm and AWQ (before its reordering) pack."""
    width = words.dtype.itemsize * 8
    w = words.astype(np.uint64)
    w = np.concatenate([w, np.zeros((w.shape[0], 1), np.uint64)], axis=1)
    start = np.arange(count) * bits
    word, offset = start // width, (start % width).astype(np.uint64)
    joined = w[:, word] | (w[:, word + 1] << np.uint64(width))
    values: np.ndarray = ((joined >> offset) & np.uint64((1 << bits) - 1)).astype(np.int64)
    return values


def level_steps(levels: np.ndarray) -> np.ndarray:
    """The grid step at each code of a table of levels: the wider of the gaps to the nearest
    distinct level on either side (round to nearest leaves a value within half of it)."""
    distinct = np.unique(levels[np.isfinite(levels)])
    position = np.searchsorted(distinct, levels)
    below = np.where(position > 0, levels - distinct[np.maximum(position - 1, 0)], 0.0)
    upper = np.minimum(position + 1, len(distinct) - 1)
    above = np.where(position + 1 < len(distinct), distinct[upper] - levels, 0.0)
    steps: np.ndarray = np.maximum(below, above)
    return steps


def fp8_steps(codes: np.ndarray, code: str) -> np.ndarray:
    """The grid spacing of an FP8 format at each stored code."""
    layout = DTYPES[code].layout
    assert layout is not None
    exponent = (codes.astype(np.int64) >> layout.mantissa_bits) & ((1 << layout.exponent_bits) - 1)
    steps: np.ndarray = np.exp2(np.maximum(exponent, 1) - layout.bias - layout.mantissa_bits)
    return steps


_FP4 = np.array(code_values("F4"))
_FP4_STEPS = level_steps(_FP4)


def laid_out_otherwise(name: str, stored: np.ndarray, shape: tuple[int, int]) -> Malformed:
    """The error for a stored tensor whose shape does not fit the original's."""
    return Malformed(f"{name}: stored {list(stored.shape)}, the original is {list(shape)}")


def _check_rows(stored: np.ndarray, name: str, shape: tuple[int, int]) -> None:
    if stored.ndim != 2 or stored.shape[0] != shape[0]:
        raise laid_out_otherwise(name, stored, shape)


def _fp8(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """FP8 elements times a scale (per tensor, channel, group or ``weight_block_size``)."""
    code = q.dtype(Role.WEIGHT)
    stored, scale = q.raw(Role.WEIGHT), _scale(q)
    grid = np.array(code_values(code))  # every value of the type: its largest finite clips
    _check_rows(stored, q.values, shape)
    for rows in blocks(shape[0]):
        s = expand(scale, rows, shape, q.scheme.block_size)
        codes = stored[rows]
        levels = as_float(codes, code)
        assert levels is not None  # an FP8 type: the registry decodes it
        steps = fp8_steps(codes, code) * s
        yield Chunk(rows, levels * s, steps, outward=float_outward(levels, grid, s))


def _scale(q: Stored) -> np.ndarray:
    """The scales, over compressed-tensors' global scale (divided) or modelopt's
    ``weight_scale_2`` (multiplied) where one is stored."""
    scale = q.floats(Role.SCALE)
    global_name = q.name(Role.GLOBAL_SCALE)
    if global_name is None:
        return scale
    g = float(read_floats(q.ckpt, global_name).reshape(-1)[0])
    return scale / g if global_name.endswith("global_scale") else scale * g


def _zero(q: Stored, scale: np.ndarray) -> np.ndarray | None:
    """compressed-tensors' zero points, stored unpacked beside the scales."""
    name = q.name(Role.ZERO_POINT)
    if name is None:
        return None
    zero = read_floats(q.ckpt, name)
    if zero.shape != scale.shape:
        raise Malformed(f"{name}: zero points of shape {list(zero.shape)}, scales differ")
    return zero


def _int8(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """compressed-tensors ``int-quantized``: INT8 times a scale, minus a zero point."""
    stored, scale = q.raw(Role.WEIGHT), _scale(q)
    zero = _zero(q, scale)
    _check_rows(stored, q.values, shape)
    for rows in blocks(shape[0]):
        s = expand(scale, rows, shape, q.scheme.block_size)
        ints = stored[rows].view(np.int8).astype(np.int64)
        outward = int_outward(ints + 128, 8, s)
        if zero is not None:
            ints = ints - expand(zero, rows, shape, q.scheme.block_size)
        yield Chunk(rows, ints * s, np.abs(s), outward=outward)


def _ct_packed(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """compressed-tensors ``pack-quantized``: offset n-bit integers packed along each row."""
    stored, scale = q.raw(Role.PACKED), _scale(q)
    zero = _zero(q, scale)
    _check_rows(stored, q.values, shape)
    bits = q.scheme.weight_bits or (stored.shape[1] * 32) // shape[1]
    for rows in blocks(shape[0]):
        s = expand(scale, rows, shape, q.scheme.block_size)
        codes = unpack_bits(stored[rows], bits, shape[1])
        ints = codes - (1 << (bits - 1))
        if zero is not None:
            ints = ints - expand(zero, rows, shape, q.scheme.block_size)
        yield Chunk(rows, ints * s, np.abs(s), outward=int_outward(codes, bits, s))


def _fp4_pairs(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """NVFP4 / MXFP4 in U8: two E2M1 codes per byte, low nibble first, times group scales."""
    stored, scale = load_array(q.ckpt, q.values), _scale(q)
    _check_rows(stored, q.values, shape)
    for rows in blocks(shape[0]):
        s = expand(scale, rows, shape)
        codes = unpack_bits(stored[rows], 4, shape[1])
        levels = _FP4[codes]
        yield Chunk(rows, levels * s, _FP4_STEPS[codes] * s, outward=float_outward(levels, _FP4, s))


def _llm_int8(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """bitsandbytes LLM.int8: row ``r`` is its INT8 codes times ``SCB[r] / 127``."""
    stored = q.raw(Role.WEIGHT)
    _check_rows(stored, q.values, shape)
    scale = q.floats(Role.SCALE).reshape(-1) / 127.0
    if scale.shape[0] != shape[0]:
        raise Malformed(f"{q.need(Role.SCALE)}: {scale.shape[0]} row scales, {shape[0]} rows")
    for rows in blocks(shape[0]):
        s = np.broadcast_to(scale[rows, None], (rows.stop - rows.start, shape[1]))
        yield Chunk(rows, stored[rows].view(np.int8).astype(np.int64) * s, np.abs(s))


Decoder = Callable[[Stored, tuple[int, int]], Iterator[Chunk]]
"""Reads one layout: the stored parameter and the original's ``(out, in)``."""

DECODERS: Mapping[Encoding, Decoder] = {
    Encoding.FP8: _fp8,
    Encoding.INT8: _int8,
    Encoding.CT_PACKED: _ct_packed,
    Encoding.NVFP4: _fp4_pairs,
    Encoding.MXFP4: _fp4_pairs,
    Encoding.LLM_INT8: _llm_int8,
}
"""The decoders of the layouts with one value per stored element (or per nibble of a U8);
:mod:`mtpcheck.checks.decoders_packed` has those of the integer-packed and codebook ones."""
