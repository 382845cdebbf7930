"""What each stored part of a (possibly quantized) parameter holds, as data.

A quantizer replaces one weight ``<module>.weight`` by several stored tensors beside it: a
packed integer tensor, scales, zero points, a global scale, the original shape. Each suffix
below says which part of the logical parameter ``<module>.weight`` a stored tensor is and
which quantization formats write it. Names are those of the writers' own code:
compressed-tensors (llm-compressor), NVIDIA modelopt's HF export, AutoAWQ / GPTQ / AutoRound,
bitsandbytes as transformers saves it, mlx-lm, and the FP8 block releases of DeepSeek, GLM and
Qwen (``weight_scale_inv``). A suffix may span name components: bitsandbytes stores its 4-bit
state under ``<module>.weight.absmax`` and ``<module>.weight.quant_state.bitsandbytes__nf4``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Role(str, enum.Enum):
    """What a stored tensor holds of its logical parameter."""

    WEIGHT = "weight"
    """The values, one element per element: full precision, or FP8 / INT8 as stored."""
    PACKED = "packed"
    """Integers packed several to an element (INT4 in I32, FP4 pairs in U8)."""
    SCALE = "scale"
    ZERO_POINT = "zero-point"
    GLOBAL_SCALE = "global-scale"
    """A per-tensor scale over the grouped scales (NVFP4)."""
    INPUT_SCALE = "input-scale"
    """Activation quantization of the module's input (static W8A8 / NVFP4)."""
    INPUT_GLOBAL_SCALE = "input-global-scale"
    INPUT_ZERO_POINT = "input-zero-point"
    SHAPE = "shape"
    """The unpacked weight's shape, stored as a tensor (compressed-tensors pack-quantized)."""
    G_IDX = "g-idx"
    """Group index of each input column (GPTQ activation ordering)."""
    OFFSET = "offset"
    """A value added per group after scaling (mlx-lm's affine ``biases``)."""
    CODEBOOK = "codebook"
    """The value of each code (bitsandbytes' ``quant_map``: the 16 NF4 or FP4 levels)."""
    NESTED_SCALE = "nested-scale"
    """Scales of the quantized scales (bitsandbytes' double quantization)."""
    NESTED_CODEBOOK = "nested-codebook"
    QUANT_STATE = "quant-state"
    """The quantizer's own record of how it quantized, stored as bytes (bitsandbytes' JSON)."""
    FORMAT = "format"
    """A marker of the stored layout (bitsandbytes' LLM.int8 ``weight_format``)."""

    @property
    def sized_by_content(self) -> bool:
        """Whether the part's shape follows what it records, not the parameter (bitsandbytes'
        JSON quant state is as long as its text): no shape to hold it to."""
        return self is Role.QUANT_STATE

    @property
    def holds_values(self) -> bool:
        """Whether this part is the weight itself (as opposed to side data describing it)."""
        return self in (Role.WEIGHT, Role.PACKED)


class Method(str, enum.Enum):
    """Quantization formats mtpcheck recognises, by the ``quant_method`` their configs name."""

    NONE = "none"
    FP8 = "fp8"
    """Block-scaled FP8 (DeepSeek-V3 / GLM / Qwen FP8 releases): ``weight`` in F8_E4M3 plus
    ``weight_scale_inv``, one scale per ``weight_block_size`` block."""
    COMPRESSED_TENSORS = "compressed-tensors"
    MODELOPT = "modelopt"
    AWQ = "awq"
    GPTQ = "gptq"
    AUTO_ROUND = "auto-round"
    """Intel AutoRound's own export (``packing_format`` ``auto_round:auto_gptq`` and kin): the
    GPTQ parts. Its GPTQ- and AWQ-style exports declare ``gptq`` and ``awq``."""
    BITSANDBYTES = "bitsandbytes"
    """bitsandbytes through transformers: NF4 / FP4 (``load_in_4bit``) or LLM.int8."""
    MLX = "mlx"
    """mlx-lm's conversions: no ``quant_method``; the config's ``quantization`` (``bits``,
    ``group_size``, ``mode``) declares it."""
    GGUF = "gguf"
    """llama.cpp's GGUF: every tensor's ggml type (``Q8_0``, ``Q4_K``, ...) is in the file's
    header and its records hold their own scales; there is no config to declare it in (the
    GGUF reader gives each file this method)."""
    OTHER = "other"
    """A ``quant_method`` mtpcheck has no part table for."""


@dataclass(frozen=True)
class StoredPart:
    """One suffix a quantizer stores beside (or instead of) ``<module>.weight``."""

    suffix: str
    """The last name component, after the module path."""
    role: Role
    methods: tuple[Method, ...]
    """Formats that write it (documentation, and where a suffix is ambiguous, the scope)."""
    needs_packed: bool = False
    """Only a part where its module also stores quantized values (see
    :func:`mtpcheck.params.quantized_modules`): AutoAWQ / GPTQ / mlx-lm's generic names
    (``scales``, ``g_idx``, ``biases``) would otherwise take any tensor so named for a part."""


_CT, _MO, _BNB, _MLX = Method.COMPRESSED_TENSORS, Method.MODELOPT, Method.BITSANDBYTES, Method.MLX
_AUTO = (Method.AWQ, Method.GPTQ, Method.AUTO_ROUND)

PARTS: tuple[StoredPart, ...] = (
    StoredPart("weight", Role.WEIGHT, (Method.NONE, Method.FP8, _CT, _MO, _BNB, _MLX)),
    StoredPart("weight_scale_inv", Role.SCALE, (Method.FP8,)),
    StoredPart("weight_packed", Role.PACKED, (_CT,)),
    StoredPart("weight_scale", Role.SCALE, (_CT, _MO)),
    StoredPart("weight_zero_point", Role.ZERO_POINT, (_CT,)),
    StoredPart("weight_global_scale", Role.GLOBAL_SCALE, (_CT,)),
    StoredPart("weight_scale_2", Role.GLOBAL_SCALE, (_MO,)),
    StoredPart("weight_shape", Role.SHAPE, (_CT,)),
    StoredPart("weight_g_idx", Role.G_IDX, (_CT,)),
    StoredPart("input_scale", Role.INPUT_SCALE, (_CT, _MO)),
    StoredPart("input_global_scale", Role.INPUT_GLOBAL_SCALE, (_CT,)),
    StoredPart("input_zero_point", Role.INPUT_ZERO_POINT, (_CT,)),
    StoredPart("qweight", Role.PACKED, _AUTO),
    StoredPart("qzeros", Role.ZERO_POINT, _AUTO, needs_packed=True),
    StoredPart("scales", Role.SCALE, (*_AUTO, _MLX), needs_packed=True),
    StoredPart("g_idx", Role.G_IDX, (Method.GPTQ, Method.AUTO_ROUND), needs_packed=True),
    StoredPart("biases", Role.OFFSET, (_MLX,), needs_packed=True),
    StoredPart("weight.absmax", Role.SCALE, (_BNB,)),
    StoredPart("weight.quant_map", Role.CODEBOOK, (_BNB,)),
    StoredPart("weight.nested_absmax", Role.NESTED_SCALE, (_BNB,)),
    StoredPart("weight.nested_quant_map", Role.NESTED_CODEBOOK, (_BNB,)),
    StoredPart("weight.quant_state.bitsandbytes__nf4", Role.QUANT_STATE, (_BNB,)),
    StoredPart("weight.quant_state.bitsandbytes__fp4", Role.QUANT_STATE, (_BNB,)),
    StoredPart("SCB", Role.SCALE, (_BNB,)),
    StoredPart("weight_format", Role.FORMAT, (_BNB,)),
)

PART_BY_SUFFIX: Mapping[str, StoredPart] = {p.suffix: p for p in PARTS}
SUFFIX_COMPONENTS = max(p.suffix.count(".") + 1 for p in PARTS)
"""The most name components a part's suffix spans."""

LOGICAL_SUFFIX = "weight"
"""The suffix a logical parameter is named by: ``<module>.weight``, whatever is stored."""


FUSED_EXPERTS: Mapping[str, tuple[str, ...]] = {
    "mlp.experts.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.experts.down_proj": ("down_proj",),
}
"""Routed experts stored fused, one ``[experts, rows, columns]`` tensor per kind (how
transformers 5 and Qwen's BF16 releases store them), and the per-expert projections whose
rows each holds, in order (``mlp.experts.{e}.gate_proj.weight`` then ``up_proj``)."""


STACKED_EXPERTS: Mapping[str, str] = {".mlp.switch_mlp.": ".mlp.experts.{e}."}
"""Routed experts stacked one tensor per projection and part, ``[experts, *per-expert shape]``
(mlx-lm's ``SwitchGLU``: ``mlp.switch_mlp.gate_proj.weight`` and its ``scales``), and the
per-expert prefix each slice ``e`` is stored under in an HF checkpoint."""
