"""How a quantized parameter's values are encoded: recognised once, from its stored parts,
their dtypes and the declared scheme (pure), for the storage label ``inspect`` prints and the
decoder ``diff --dequantize`` runs.

Each encoding is the layout a writer's own code produces; :mod:`mtpcheck.checks.decoders`
decodes each one, and docs/formats/quantized.md describes them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from mtpcheck.dtypes import DTYPES, Kind, is_fp8, is_high_precision
from mtpcheck.model import TensorMeta
from mtpcheck.params.grouping import LogicalParam
from mtpcheck.params.parts import Method, Role
from mtpcheck.params.scheme import Scheme


class Encoding(str, enum.Enum):
    """The layouts of stored values mtpcheck reads."""

    FULL = "full"
    """16- or 32-bit floats, one per element."""
    FP8 = "fp8"
    """FP8 elements times a scale per tensor, channel, group or block."""
    INT8 = "int8"
    """INT8 elements times a scale (minus a zero point): compressed-tensors ``int-quantized``."""
    LLM_INT8 = "llm.int8"
    """bitsandbytes' LLM.int8: INT8 rows times ``SCB / 127`` (one absmax per row)."""
    CT_PACKED = "ct-packed"
    """compressed-tensors ``pack-quantized``: n-bit integers packed densely along each row of
    ``weight_packed`` (offset ``2**(n-1)``), times a scale per group, minus a zero point."""
    NVFP4 = "nvfp4"
    """FP4 (E2M1) pairs in U8, low nibble first, times FP8 scales per 16 over a global scale."""
    MXFP4 = "mxfp4"
    """FP4 (E2M1) pairs in U8 times a power-of-two (E8M0) scale per 32."""
    BNB_4BIT = "bnb-4bit"
    """bitsandbytes NF4 / FP4: the flattened tensor's 4-bit codes, two to a byte (high nibble
    first), looked up in the stored ``quant_map`` and scaled by one ``absmax`` per block;
    with double quantization the absmax are themselves 8-bit codes over ``nested_absmax``."""
    GPTQ = "gptq"
    """GPTQ: ``qweight`` [in * bits / 32, out], n-bit integers packed along the input dimension;
    ``qzeros`` [groups, out * bits / 32] packed along the output one; ``scales`` [groups, out];
    the group of each input column from ``g_idx`` (or by position)."""
    AWQ = "awq"
    """AutoAWQ GEMM: ``qweight`` [in, out * bits / 32] packed along the output dimension in the
    order 0, 2, 4, 6, 1, 3, 5, 7 within each word; ``qzeros`` alike; ``scales`` [groups, out]."""
    MLX_AFFINE = "mlx-affine"
    """mlx-lm affine: ``weight`` U32 [out, in * bits / 32] packed along each row,
    value = ``scales`` * q + ``biases``, one scale and bias per group of input columns."""
    MLX_FLOAT = "mlx-float"
    """mlx-lm ``nvfp4`` / ``mxfp4`` / ``mxfp8``: float codes packed into U32 words, lowest bits
    first (E2M1 eight to a word, E4M3 four), times a scale stored as U8: E4M3 per 16 (nvfp4)
    or E8M0 per 32 (mxfp4, mxfp8)."""
    OTHER = "other"
    """Stored in a way mtpcheck does not decode (labelled by its dtype)."""


def _meta(param: LogicalParam, role: Role, tensors: Mapping[str, TensorMeta]) -> TensorMeta | None:
    name = param.part(role)
    return tensors.get(name) if name is not None else None


def _has(param: LogicalParam, suffix: str) -> bool:
    return any(name.endswith("." + suffix) for name in param.stored)


def encoding_of(
    param: LogicalParam, tensors: Mapping[str, TensorMeta], scheme: Scheme
) -> Encoding | None:
    """How ``param``'s values are encoded; None when no values are stored."""
    values = param.values
    meta = tensors.get(values) if values is not None else None
    if values is None or meta is None:
        return None
    dtype = meta.dtype
    scale = _meta(param, Role.SCALE, tensors)
    if dtype == "U8" and param.part(Role.GLOBAL_SCALE) is not None:
        return Encoding.NVFP4
    if dtype == "U8" and scale is not None and (is_fp8(scale.dtype) or scale.dtype == "F8_E8M0"):
        return Encoding.MXFP4
    packed = param.part(Role.PACKED)
    if packed is not None:
        return _packed(param, packed, tensors, scheme)
    if param.part(Role.CODEBOOK) or param.part(Role.QUANT_STATE):
        return Encoding.BNB_4BIT
    if is_high_precision(dtype):
        return Encoding.FULL
    if is_fp8(dtype):
        return Encoding.FP8
    if dtype == "U32" and scale is not None:
        return Encoding.MLX_AFFINE if param.part(Role.OFFSET) else Encoding.MLX_FLOAT
    known = DTYPES.get(dtype)
    if known is not None and known.kind in (Kind.INT, Kind.UINT) and known.bits == 8:
        return Encoding.LLM_INT8 if _has(param, "SCB") else Encoding.INT8
    return Encoding.OTHER


_AWQ_WORDS = ("awq",)
"""A variant name that makes AutoRound's packed export AWQ's (``auto_round:auto_awq``)."""


def _packed(
    param: LogicalParam, packed: str, tensors: Mapping[str, TensorMeta], scheme: Scheme
) -> Encoding:
    """compressed-tensors' ``weight_packed``, or a ``qweight`` of GPTQ or AWQ: the declared
    method says which; without one, the shapes do (GPTQ's scales have qweight's columns)."""
    if not packed.endswith(".qweight"):
        return Encoding.CT_PACKED
    if scheme.method is Method.AWQ or any(w in f for f in scheme.formats for w in _AWQ_WORDS):
        return Encoding.AWQ
    if scheme.method in (Method.GPTQ, Method.AUTO_ROUND):
        return Encoding.GPTQ
    scale = _meta(param, Role.SCALE, tensors)
    words = tensors.get(packed)
    if scale is not None and words is not None and scale.shape[-1:] == words.shape[-1:]:
        return Encoding.GPTQ
    return Encoding.AWQ


def label_of(encoding: Encoding, param: LogicalParam, dtype: str, scheme: Scheme) -> str:
    """The storage in words a person compares across layers: ``NF4``, ``INT4``, ``NVFP4``."""
    if encoding is Encoding.FULL or encoding is Encoding.OTHER:
        return dtype
    if encoding is Encoding.BNB_4BIT:
        state = param.part(Role.QUANT_STATE) or ""
        quant_type = state.rpartition("__")[2] if "__" in state else _bnb_type(scheme)
        return quant_type.upper()
    if encoding is Encoding.MLX_FLOAT:
        mode = scheme.formats[0] if scheme.method is Method.MLX and scheme.formats else "float"
        return mode.upper()
    fixed = _FIXED_LABELS.get(encoding)
    if fixed is not None:
        return fixed
    bits = scheme.weight_bits
    return f"INT{bits}" if bits else "packed"


_FIXED_LABELS = {
    Encoding.FP8: "FP8",
    Encoding.INT8: "INT8",
    Encoding.LLM_INT8: "INT8",
    Encoding.NVFP4: "NVFP4",
    Encoding.MXFP4: "MXFP4",
}


def _bnb_type(scheme: Scheme) -> str:
    return next((f for f in scheme.formats if f in ("nf4", "fp4")), "4bit")
