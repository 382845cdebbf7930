"""Dequantize one quantized parameter and measure it against its full-precision original, in
units of the quantization step (``diff --dequantize``).

A quantizer rounds each value to the nearest point of its grid, so a faithful quantized copy
lies within half a step of the original everywhere; a layer holding another tensor's data, or
garbage, is many steps off. Layouts read (as the writers' own code lays them out):

* FP8 (E4M3 / E5M2) weights times a scale per tensor, channel, group or block: DeepSeek /
  GLM / Qwen ``weight_scale_inv`` releases, compressed-tensors ``float-quantized``, modelopt FP8;
* INT8 weights times a scale (compressed-tensors ``int-quantized``);
* compressed-tensors ``pack-quantized``: ``num_bits`` integers packed densely into I32 words
  (element ``i`` at bit ``i * num_bits``, stored with an offset of ``2**(num_bits - 1)``),
  times a scale per group of input columns, minus a zero point where stored unpacked;
* NVFP4: FP4 (E2M1) pairs in U8 (low nibble first) times FP8 group scales, over
  compressed-tensors' ``weight_global_scale`` (divided) or modelopt's ``weight_scale_2``
  (multiplied).

Rows are processed a block at a time, so memory beyond the stored bytes stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from mtpcheck.checks.tensor_match import as_float
from mtpcheck.dtypes import DTYPES, is_fp8, is_high_precision
from mtpcheck.mapping.views import load_array
from mtpcheck.model import Checkpoint
from mtpcheck.params import LogicalParam, Role, Scheme

_ROWS = 256
"""Rows dequantized at a time."""
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_STEP = np.array([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0])


class NotDequantized(Exception):
    """A layout this module does not read (the reason is the message)."""


def _floats(ckpt: Checkpoint, name: str) -> np.ndarray:
    values = as_float(load_array(ckpt, name), ckpt.tensors[name].dtype)
    if values is None:
        raise NotDequantized(f"{name}: {ckpt.tensors[name].dtype} values cannot be read")
    return values


def _part(ckpt: Checkpoint, param: LogicalParam, role: Role) -> str | None:
    name = param.part(role)
    return name if name is not None and name in ckpt.tensors else None


def _expand(
    scale: np.ndarray, rows: slice, shape: tuple[int, int], block: tuple[int, ...] | None
) -> np.ndarray:
    """``scale`` (per tensor, channel, group or block) broadcast over ``rows`` of a matrix."""
    out, cols = shape
    s = scale.reshape(1, 1) if scale.size == 1 else scale.reshape(scale.shape[0], -1)
    r, c = s.shape
    bo = block[0] if block and len(block) == 2 else math.ceil(out / r)
    bi = block[1] if block and len(block) == 2 else math.ceil(cols / c)
    row_index = np.arange(rows.start, rows.stop) // bo
    col_index = np.arange(cols) // bi
    if row_index.max(initial=0) >= r or col_index.max(initial=0) >= c:
        raise NotDequantized(f"a scale of shape {list(scale.shape)} does not cover {list(shape)}")
    expanded: np.ndarray = s[row_index][:, col_index]
    return expanded


def _fp8_steps(codes: np.ndarray, code: str) -> np.ndarray:
    """The grid spacing of an FP8 format at each stored code."""
    layout = DTYPES[code].layout
    assert layout is not None
    exponent = (codes.astype(np.int64) >> layout.mantissa_bits) & ((1 << layout.exponent_bits) - 1)
    steps: np.ndarray = np.exp2(np.maximum(exponent, 1) - layout.bias - layout.mantissa_bits)
    return steps


def _unpack_ints(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """compressed-tensors' dense packing undone: element ``i`` of a row at bit ``i * bits``."""
    w = np.concatenate([words.view(np.uint32), np.zeros((words.shape[0], 1), np.uint32)], axis=1)
    w = w.astype(np.uint64)
    start = np.arange(cols) * bits
    word, offset = start // 32, (start % 32).astype(np.uint64)
    joined = w[:, word] | (w[:, word + 1] << np.uint64(32))
    values = (joined >> offset) & np.uint64((1 << bits) - 1)
    signed: np.ndarray = values.astype(np.int64) - (1 << (bits - 1))
    return signed


def _blocks(out: int) -> Iterator[slice]:
    for start in range(0, out, _ROWS):
        yield slice(start, min(out, start + _ROWS))


def _steps_against(
    reference: np.ndarray, chunks: Iterator[tuple[slice, np.ndarray, np.ndarray]]
) -> float:
    worst = 0.0
    for rows, values, step in chunks:
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.abs(values - reference[rows]) / step
        err = np.where(np.isnan(err), np.inf, err)
        err = np.where((values == reference[rows]), 0.0, err)
        worst = max(worst, float(err.max(initial=0.0)))
    return worst


def full_precision(ckpt: Checkpoint, param: LogicalParam) -> np.ndarray:
    """The values of ``param``, which ``ckpt`` stores in full precision."""
    weight = _part(ckpt, param, Role.WEIGHT)
    if weight is None or not is_high_precision(ckpt.tensors[weight].dtype):
        raise NotDequantized("the other side is not stored in full precision")
    return _floats(ckpt, weight)


def steps_off(
    reference: np.ndarray, quant: Checkpoint, param: LogicalParam, scheme: Scheme
) -> float:
    """The largest distance, in quantization steps, between ``param`` (quantized, in
    ``quant``) dequantized and ``reference`` (the full-precision values)."""
    if reference.ndim != 2:
        raise NotDequantized(f"{param.name}: only matrices are dequantized, not {reference.ndim}-D")
    out, cols = reference.shape
    scale_name = _part(quant, param, Role.SCALE)
    if scale_name is None:
        raise NotDequantized(f"{param.name}: no scale stored")
    scale = _floats(quant, scale_name)
    packed = _part(quant, param, Role.PACKED)
    values = param.values
    assert values is not None
    code = quant.tensors[values].dtype
    global_name = _part(quant, param, Role.GLOBAL_SCALE)
    if global_name is not None:
        g = float(_floats(quant, global_name).reshape(-1)[0])
        scale = scale / g if global_name.endswith("global_scale") else scale * g
    zero_name = _part(quant, param, Role.ZERO_POINT)
    zero = _floats(quant, zero_name) if zero_name is not None else None
    if zero is not None and zero.shape != scale.shape:
        raise NotDequantized(f"{zero_name}: packed zero points are not read")
    stored = load_array(quant, values)
    block = scheme.block_size

    def chunks() -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
        for rows in _blocks(out):
            s = _expand(scale, rows, (out, cols), block)
            if is_fp8(code):
                codes = stored[rows]
                yield rows, as_float(codes, code) * s, _fp8_steps(codes, code) * s
            elif code == "U8" and global_name is not None:  # NVFP4
                nibbles = np.stack([stored[rows] & 0x0F, stored[rows] >> 4], axis=-1)
                nibbles = nibbles.reshape(rows.stop - rows.start, -1)[:, :cols]
                sign = np.where(nibbles & 0x08, -1.0, 1.0)
                yield rows, sign * _E2M1[nibbles & 0x07] * s, _E2M1_STEP[nibbles & 0x07] * s
            elif code == "I32" and packed is not None:
                bits = scheme.weight_bits or (stored.shape[1] * 32) // cols
                q = _unpack_ints(stored[rows], bits, cols)
                if zero is not None:
                    q = q - _expand(zero, rows, (out, cols), block)
                yield rows, q * s, np.abs(s)
            elif code == "I8":
                q = stored[rows].view(np.int8).astype(np.int64)
                if zero is not None:
                    q = q - _expand(zero, rows, (out, cols), block)
                yield rows, q * s, np.abs(s)
            else:
                raise NotDequantized(f"{values}: {code} storage is not dequantized")

    if stored.ndim != 2 or stored.shape[0] != out:
        raise NotDequantized(
            f"{values}: stored {list(stored.shape)}, the original is {[out, cols]}"
        )
    return _steps_against(reference, chunks())
