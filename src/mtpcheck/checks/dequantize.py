"""Dequantize one quantized parameter and measure it against its full-precision original, in
units of the quantization step (``diff --dequantize``).

A quantizer rounds each value to the nearest point of its grid, so a faithful quantized copy
lies within half a step of the original everywhere; a layer holding another tensor's data, or
garbage, is many steps off. Which layout a parameter is stored in is decided once, by
:func:`mtpcheck.params.encodings.encoding_of`; each layout's decoder is in
:mod:`mtpcheck.checks.decoders`. Rows are processed a block at a time, so memory beyond the
stored bytes stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mtpcheck.checks import decoders_packed as packed
from mtpcheck.checks.decoders import (
    DECODERS,
    Chunk,
    Decoder,
    Malformed,
    NotDequantized,
    Stored,
    read_floats,
)
from mtpcheck.dtypes import is_high_precision
from mtpcheck.model import Checkpoint
from mtpcheck.params import LogicalParam, Role, Scheme
from mtpcheck.params.encodings import Encoding, encoding_of

_DECODERS: dict[Encoding, Decoder] = {
    **DECODERS,
    Encoding.BNB_4BIT: packed.bnb_4bit,
    Encoding.GPTQ: packed.gptq,
    Encoding.AWQ: packed.awq,
    Encoding.MLX_AFFINE: packed.mlx_affine,
    Encoding.MLX_FLOAT: packed.mlx_float,
}
"""Every layout ``--dequantize`` reads, and its decoder."""

__all__ = ["Malformed", "NotDequantized", "full_precision", "steps_off"]


def _steps_against(reference: np.ndarray, chunks: Iterator[Chunk]) -> float:
    """The largest distance, in steps, of a dequantized value from its original, past the
    rounding the layout's own stored parameters explain and past the end of its grid."""
    worst = 0.0
    for chunk in chunks:
        original = reference[chunk.rows]
        excess = np.abs(chunk.values - original) - chunk.slack
        if chunk.outward is not None:  # clipped at the grid's last point: measured from it
            excess = np.where(chunk.outward * (original - chunk.values) > 0, 0.0, excess)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.maximum(excess, 0.0) / np.abs(chunk.steps)  # a negative scale too
        err = np.where(np.isnan(err), np.inf, err)
        err = np.where((chunk.values == original), 0.0, err)
        worst = max(worst, float(err.max(initial=0.0)))
    return worst


def full_precision(ckpt: Checkpoint, param: LogicalParam) -> np.ndarray:
    """The values of ``param``, which ``ckpt`` stores in full precision."""
    weight = param.part(Role.WEIGHT)
    if weight is None or weight not in ckpt.tensors:
        raise NotDequantized("the other side is not stored in full precision")
    if not is_high_precision(ckpt.tensors[weight].dtype):
        raise NotDequantized("the other side is not stored in full precision")
    return read_floats(ckpt, weight)


def steps_off(
    reference: np.ndarray, quant: Checkpoint, param: LogicalParam, scheme: Scheme
) -> float:
    """The largest distance, in quantization steps, between ``param`` (quantized, in
    ``quant``) dequantized and ``reference`` (the full-precision values)."""
    if reference.ndim != 2:
        raise NotDequantized(f"{param.name}: only matrices are dequantized, not {reference.ndim}-D")
    encoding = encoding_of(param, quant.tensors, scheme)
    decoder = _DECODERS.get(encoding) if encoding is not None else None
    if decoder is None:
        meta = quant.tensors.get(param.values or "")
        raise NotDequantized(
            f"{param.values}: {meta.dtype if meta else 'absent'} storage is not dequantized"
        )
    shape = (int(reference.shape[0]), int(reference.shape[1]))
    return _steps_against(reference, decoder(Stored(quant, param, scheme), shape))
