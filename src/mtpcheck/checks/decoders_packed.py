"""Decoders of the layouts that pack several codes into a word or look codes up in a stored
table: bitsandbytes NF4 / FP4, GPTQ, AWQ and mlx-lm (see
:class:`~mtpcheck.params.encodings.Encoding` for each layout)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from mtpcheck.checks.decoders import (
    Chunk,
    Malformed,
    NotDequantized,
    Stored,
    blocks,
    expand,
    float_outward,
    half_ulp,
    int_outward,
    laid_out_otherwise,
    level_steps,
    unpack_bits,
)
from mtpcheck.dtypes import code_values
from mtpcheck.mapping.views import load_array
from mtpcheck.params import Role

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's order within a 32-bit word of eight 4-bit values: position ``j`` holds column
``_AWQ_ORDER[j]`` of the word's eight."""
_MLX_FLOAT_MODES = {
    "nvfp4": ("F4", "F8_E4M3", 4),
    "mxfp4": ("F4", "F8_E8M0", 4),
    "mxfp8": ("F8_E4M3", "F8_E8M0", 8),
}
"""mlx-lm's float modes: (element type, scale type (stored as U8), element bits)."""
_MLX_FLOAT_GUESS = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}
"""The mode by element bits and group size, where the config does not name it."""


def quant_state(q: Stored) -> Mapping[str, Any]:
    """bitsandbytes' quant state: the JSON it stores as the bytes of a U8 tensor."""
    name = q.need(Role.QUANT_STATE)
    try:
        state = json.loads(load_array(q.ckpt, name).astype(np.uint8).tobytes().decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise Malformed(f"{name}: not bitsandbytes' quant state JSON ({e})") from e
    if not isinstance(state, dict) or not isinstance(state.get("blocksize"), int):
        raise Malformed(f"{name}: not bitsandbytes' quant state JSON")
    return state


def _bnb_absmax(q: Stored, state: Mapping[str, Any]) -> np.ndarray:
    """One absmax per block: stored as floats, or (double quantization) as 8-bit codes of
    ``nested_quant_map`` times a ``nested_absmax`` per ``nested_blocksize`` codes, plus
    ``nested_offset``."""
    if q.name(Role.NESTED_SCALE) is None:
        return q.floats(Role.SCALE).reshape(-1)
    codes = q.raw(Role.SCALE).reshape(-1).astype(np.int64)
    table = q.floats(Role.NESTED_CODEBOOK).reshape(-1)
    nested = q.floats(Role.NESTED_SCALE).reshape(-1)
    size = state.get("nested_blocksize")
    offset = state.get("nested_offset", 0.0)
    if not isinstance(size, int) or size <= 0 or not isinstance(offset, int | float):
        raise Malformed(f"{q.need(Role.QUANT_STATE)}: no nested block size or offset")
    index = np.arange(codes.size) // size
    if codes.max(initial=0) >= table.size or index.max(initial=0) >= nested.size:
        raise Malformed(f"{q.need(Role.SCALE)}: nested absmax do not cover the codes")
    absmax: np.ndarray = table[codes] * nested[index] + float(offset)
    return absmax


def bnb_4bit(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """bitsandbytes NF4 / FP4: the flattened matrix's codes, two per byte, high nibble first,
    each the ``quant_map`` level times its block's absmax."""
    out, cols = shape
    state = quant_state(q)
    if list(state.get("shape", ())) != [out, cols]:
        raise Malformed(f"{q.values}: quant state shape {state.get('shape')}, not {[out, cols]}")
    table = q.floats(Role.CODEBOOK).reshape(-1)
    steps = level_steps(table)
    absmax = _bnb_absmax(q, state)
    packed = q.raw(Role.WEIGHT).reshape(-1)
    blocksize = int(state["blocksize"])
    if packed.size * 2 < out * cols or math.ceil(out * cols / blocksize) > absmax.size:
        raise Malformed(f"{q.values}: {packed.size} bytes do not hold {[out, cols]}")
    for rows in blocks(out):
        first, last = rows.start * cols, rows.stop * cols
        raw = packed[first // 2 : (last + 1) // 2].astype(np.int64)
        codes = np.stack([raw >> 4, raw & 0x0F], axis=-1).reshape(-1)
        codes = codes[first % 2 : first % 2 + last - first]
        scale = absmax[np.arange(first, last) // blocksize]
        size = (rows.stop - rows.start, cols)
        levels = table[codes]
        yield Chunk(
            rows,
            (levels * scale).reshape(size),
            (steps[codes] * scale).reshape(size),
            outward=float_outward(levels, table, scale).reshape(size),
        )


def _groups(q: Stored, cols: int, count: int) -> np.ndarray:
    """The group of each input column: GPTQ's ``g_idx`` where stored, else by position."""
    name = q.name(Role.G_IDX)
    if name is not None:
        index = load_array(q.ckpt, name).reshape(-1).view(np.int32).astype(np.int64)
        if index.size != cols or index.min(initial=0) < 0 or index.max(initial=0) >= count:
            raise Malformed(f"{name}: not a group index of {cols} columns in {count} groups")
        return index
    size = q.scheme.group_size if q.scheme.group_size else math.ceil(cols / count)
    index = np.arange(cols) // size
    if index.max(initial=0) >= count:
        raise Malformed(f"{q.need(Role.SCALE)}: {count} groups do not cover {cols} columns")
    return index


def _gptq_zero_offset(q: Stored) -> int:
    """GPTQ's v1 checkpoints (and AutoRound's ``auto_round:auto_gptq`` packing) store each
    zero point minus one; ``gptq_v2`` and AutoRound's own ``auto_round`` packing store it as
    it is."""
    return 0 if any(f in _ZEROS_AS_THEY_ARE for f in q.scheme.formats) else 1


_ZEROS_AS_THEY_ARE = ("gptq_v2", "auto_round")
"""The ``checkpoint_format`` / ``packing_format`` values whose zero points carry no offset."""


def gptq(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """GPTQ: ``qweight`` packed along the input dimension, zero points along the output one."""
    out, cols = shape
    words = q.raw(Role.PACKED)
    if words.ndim != 2 or words.shape[1] != out:
        raise laid_out_otherwise(q.values, words, shape)
    packed_as = words.shape[0] * 32 // cols
    bits = q.scheme.weight_bits or packed_as
    if words.shape[0] != -(-cols * bits // 32):  # GPTQModel pads the last word
        raise Malformed(
            f"{q.values}: {list(words.shape)} packs {cols} columns {packed_as} bits each, "
            f"the config declares {bits}"
        )
    scales = q.floats(Role.SCALE)
    group = _groups(q, cols, scales.shape[0])
    zeros = _packed_zeros(q, bits, out, scales.shape[0], stored_minus=_gptq_zero_offset(q))
    for rows in blocks(out):
        ints = unpack_bits(np.ascontiguousarray(words[:, rows].T), bits, cols)
        s = scales[group][:, rows].T
        outward = int_outward(ints, bits, s)
        yield Chunk(rows, (ints - zeros[group][:, rows].T) * s, np.abs(s), outward=outward)


def _packed_zeros(
    q: Stored,
    bits: int,
    out: int,
    groups: int,
    order: np.ndarray | None = None,
    stored_minus: int = 0,
) -> np.ndarray:
    """Zero points packed ``bits`` at a time along each group's row (``qzeros``), each stored
    ``stored_minus`` below its value; the middle of the range where none are stored
    (symmetric)."""
    name = q.name(Role.ZERO_POINT)
    if name is None:
        return np.full((groups, out), 1 << (bits - 1), np.int64)
    zeros = unpack_bits(load_array(q.ckpt, name), bits, out) + stored_minus
    if zeros.shape[0] != groups:
        raise Malformed(f"{name}: {zeros.shape[0]} groups of zero points, {groups} scales")
    return zeros[:, order] if order is not None else zeros


def _awq_order(out: int, bits: int) -> np.ndarray:
    """The stream position of each output column in AutoAWQ's packing."""
    per_word = 32 // bits
    if per_word != len(_AWQ_ORDER) or out % per_word:
        raise NotDequantized(f"AWQ packs 4-bit values eight to a word, not {bits}-bit ones")
    inverse = np.argsort(np.array(_AWQ_ORDER))
    return (np.arange(out) // per_word) * per_word + inverse[np.arange(out) % per_word]


def _codes_in_rows(
    q: Stored, role: Role, shape: tuple[int, int], rows: int, per_row: int
) -> tuple[np.ndarray, int]:
    """The stored words of ``role``, ``rows`` rows each packing ``per_row`` codes, and the
    bits of a code that their width implies."""
    words = q.raw(role)
    if words.ndim != 2 or words.shape[0] != rows or (words.shape[1] * 32) % per_row:
        raise laid_out_otherwise(q.values, words, shape)
    return words, words.shape[1] * 32 // per_row


def awq(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """AutoAWQ GEMM: ``qweight`` [in, out / 8], each word eight output columns reordered."""
    out, cols = shape
    words, bits = _codes_in_rows(q, Role.PACKED, shape, cols, out)
    order = _awq_order(out, bits)
    scales = q.floats(Role.SCALE)
    group = _groups(q, cols, scales.shape[0])
    zeros = _packed_zeros(q, bits, out, scales.shape[0], order)
    ints = unpack_bits(words, bits, out)[:, order]
    for rows in blocks(out):
        s = scales[group][:, rows].T
        codes = ints[:, rows].T
        outward = int_outward(codes, bits, s)
        yield Chunk(rows, (codes - zeros[group][:, rows].T) * s, np.abs(s), outward=outward)


def mlx_affine(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """mlx-lm affine: ``scales * q + biases`` per group, q packed along each row."""
    out, cols = shape
    words, bits = _codes_in_rows(q, Role.WEIGHT, shape, out, cols)
    scales, biases = q.floats(Role.SCALE), q.floats(Role.OFFSET)
    rounded_to = q.dtype(Role.SCALE)
    for rows in blocks(out):
        s, b = expand(scales, rows, shape), expand(biases, rows, shape)
        ints = unpack_bits(words[rows], bits, cols)
        values = ints * s + b
        slack = (
            ints * half_ulp(s, rounded_to) + half_ulp(b, rounded_to) + half_ulp(values, rounded_to)
        )
        yield Chunk(rows, values, np.abs(s), slack=slack, outward=int_outward(ints, bits, s))


def mlx_float(q: Stored, shape: tuple[int, int]) -> Iterator[Chunk]:
    """mlx-lm ``nvfp4`` / ``mxfp4`` / ``mxfp8``: float codes packed into U32 words, lowest
    bits first, times a float scale per group stored as U8."""
    out, cols = shape
    words, bits = _codes_in_rows(q, Role.WEIGHT, shape, out, cols)
    scale_codes = q.raw(Role.SCALE)
    element, scale_type = _mlx_float_types(q, bits, cols // max(1, scale_codes.shape[-1]))
    levels = np.array(code_values(element))
    steps = level_steps(levels)
    scales = np.array(code_values(scale_type))[scale_codes.astype(np.int64)]
    for rows in blocks(out):
        s = expand(scales, rows, shape)
        codes = unpack_bits(words[rows], bits, cols)
        found = levels[codes]
        yield Chunk(rows, found * s, steps[codes] * s, outward=float_outward(found, levels, s))


def _mlx_float_types(q: Stored, bits: int, group: int) -> tuple[str, str]:
    """The element and scale float types of an mlx-lm float mode: the config's ``mode``, else
    the element width and group size."""
    declared = next((f for f in q.scheme.formats if f in _MLX_FLOAT_MODES), None)
    mode = declared or _MLX_FLOAT_GUESS.get((bits, group))
    if mode is None:
        raise NotDequantized(f"{q.values}: no float mode of {bits}-bit codes in groups of {group}")
    element, scale_type, width = _MLX_FLOAT_MODES[mode]
    if width != bits:
        raise Malformed(f"{q.values}: {bits}-bit codes stored, {mode} has {width}")
    return element, scale_type


__all__ = ["awq", "bnb_4bit", "gptq", "mlx_affine", "mlx_float"]
