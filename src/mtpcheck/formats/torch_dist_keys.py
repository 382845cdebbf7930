"""megatron-core's torch_dist key scheme, both ways, as data and pure functions.

A *canonical name* is a ``GPTModel.state_dict()`` tensor name of megatron-core's *local*
(non-Transformer-Engine) layer spec, one tensor per layer and per expert. A torch_dist
checkpoint stores it under a *sharded key*, possibly with prepended axes (which layer, which
expert) and possibly split by rows into several keys. The writer goes forward
(:func:`to_sharded_key`, given the :class:`Layout` it writes); the readers go back
(:class:`KeyTemplate`, :func:`from_sharded_key`) without knowing the layout, so that they also
read what megatron-core itself wrote. The two directions share the tables below, which is what
keeps them inverse to each other (``tests/test_torch_dist_keys.py`` checks it). The rules:

* layer axis: a stacked decoder (homogeneous layers) stores ``decoder.layers.{k}.X`` as
  ``decoder.layers.X`` with a leading layer axis; otherwise the key keeps ``{k}``. MTP layers
  are never stacked;
* expert axis: ``mlp.experts.local_experts.{e}.X`` is stored as ``mlp.experts.experts.X`` with
  an expert axis after the layer axis (singleton-shard saves keep the index:
  ``experts.experts.{e}.X``);
* ``mtp.layers.{i}.mtp_model_layer.`` (the in-memory name of megatron-core >= 0.17) is stored
  as ``mtp.layers.{i}.transformer_layer.`` (the torch_dist spelling of every version);
* fused norms (:data:`FUSED_NORMS`): a layer spec that fuses a norm into the next linear layer
  stores ``<layer>.input_layernorm.{weight,bias}`` as
  ``<layer>.self_attention.linear_qkv.layer_norm_{weight,bias}`` (a gated-delta-net layer:
  ``<layer>.self_attention.in_proj.layer_norm_weight``) and ``<layer>.pre_mlp_layernorm.`` as
  ``<layer>.mlp.linear_fc1.layer_norm_``. Which layers do so is the layout's
  (:class:`NormSpec`); the readers undo every such rename wherever it appears (a TE-spec MoE
  layer already stores ``pre_mlp_layernorm.weight``, which stays). The Transformer Engine MLA
  spec's fused norms (``self_attention.linear_q_up_proj.layer_norm_weight``,
  ``self_attention.linear_kv_up_proj.layer_norm_weight``) are the local spec's
  ``q_layernorm`` / ``kv_layernorm`` and read back as those; the writer writes no TE MLA
  layout;
* row parts (:data:`ROW_PARTS`): the gated delta net stores ``in_proj.weight`` and
  ``conv1d.weight`` as one key per part (``in_proj.weight.query``, ...), rows in table order;
  singleton-shard saves store SwiGLU ``linear_fc1.weight`` as ``linear_fc1.weight_w`` (gate)
  and ``linear_fc1.weight_v`` (up), read back here; the writer writes one ``linear_fc1`` key
  in two fragments along the rows instead (:attr:`Placement.glu_fc1`).

Every other name (embedding, output layer, final norm, MTP ``enorm`` / ``hnorm`` /
``eh_proj``) is its own key. Per-rank shards and bytes are the readers' and the writer's.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

Offsets = tuple[tuple[int, int, int], ...]
"""Prepended axes of a sharded tensor as ``(axis, offset, fragments)``: the layer axis, then
the expert axis (the arguments of megatron-core's ``ShardedTensor.from_rank_offsets``)."""
RowParts = tuple[tuple[str, int], ...]
"""A tensor stored split by rows: ``(part name, rows)`` per key, in row order."""

# --- norm renames ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FusedNorm:
    """A norm that a layer spec fuses into the next linear layer, and so saves under that
    linear layer's name. Both names are prefixes relative to the layer."""

    norm: str
    """The canonical (local-spec, unfused) prefix, e.g. ``input_layernorm.``."""
    fused: str
    """The prefix on disk, e.g. ``self_attention.linear_qkv.layer_norm_``."""


QKV_INPUT_NORM = FusedNorm("input_layernorm.", "self_attention.linear_qkv.layer_norm_")
FC1_PRE_MLP_NORM = FusedNorm("pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_")
IN_PROJ_INPUT_NORM = FusedNorm("input_layernorm.", "self_attention.in_proj.layer_norm_")
MLA_Q_NORM = FusedNorm("self_attention.q_layernorm.", "self_attention.linear_q_up_proj.layer_norm_")
MLA_KV_NORM = FusedNorm(
    "self_attention.kv_layernorm.", "self_attention.linear_kv_up_proj.layer_norm_"
)
"""megatron-core's Transformer Engine MLA spec builds ``linear_q_up_proj`` /
``linear_kv_up_proj`` as ``TELayerNormColumnParallelLinear`` with ``q_layernorm`` /
``kv_layernorm`` an identity: the norms the local spec keeps as modules of their own (what
Megatron-Bridge 0.6 writes for DeepSeek-V3)."""
MAMBA_IN_PROJ_NORM = FusedNorm("norm.", "mixer.in_proj.layer_norm_")
"""A Mamba layer of the Transformer Engine hybrid spec fuses its ``norm`` into the mixer's
``in_proj`` (Nemotron-H as Megatron-Bridge 0.6 writes it)."""
FUSED_NORMS: tuple[FusedNorm, ...] = (
    QKV_INPUT_NORM,
    FC1_PRE_MLP_NORM,
    IN_PROJ_INPUT_NORM,
    MLA_Q_NORM,
    MLA_KV_NORM,
    MAMBA_IN_PROJ_NORM,
)
"""Every fused norm torch_dist keys can hold; the readers undo all of them."""
LOCAL_SPEC_NORMS: tuple[FusedNorm, ...] = (QKV_INPUT_NORM, FC1_PRE_MLP_NORM)
"""The ``sharded_state_dict_keys_map`` of ``get_gpt_layer_local_spec`` (non-MLA), every layer."""


class NormSpec(Enum):
    """Which norms of a layer are saved fused, by layer spec."""

    LOCAL = "local"
    """``get_gpt_layer_local_spec`` without MLA: :data:`LOCAL_SPEC_NORMS` in every layer."""
    UNFUSED = "unfused"
    """The local MLA spec: no norm is renamed."""
    TE_GATED_DELTA_NET = "te-gated-delta-net"
    """Transformer Engine, gated-delta-net block (Qwen3-Next): the input norm is fused into
    ``in_proj`` (linear-attention layers) or ``linear_qkv`` (the others); the pre-MLP norm into
    ``linear_fc1`` of dense layers (an MoE layer keeps ``pre_mlp_layernorm``)."""
    TE_DSA = "te-dsa"
    """Transformer Engine, DSA (MLA) layers: the input norm stays unfused; the pre-MLP norm is
    fused into ``linear_fc1`` of dense layers."""


# --- row parts ------------------------------------------------------------------------------

GLU_HALVES: tuple[str, ...] = ("w", "v")
"""Suffixes of the gate and the up half of a singleton-shard SwiGLU ``linear_fc1``, in row
order (``weight_w``, ``weight_v``, ``bias_w``, ``bias_v``)."""
SPLIT_MODULES: Mapping[str, tuple[str, ...]] = {
    "in_proj": ("query", "key", "value", "z", "beta", "alpha"),
    "conv1d": ("query", "key", "value"),
}
"""Modules whose ``weight`` megatron-core's ``GatedDeltaNet.sharded_state_dict`` stores as one
key per part (``<module>.weight.<part>``), the parts' rows in this order."""
MAMBA_SPLIT_MODULES: Mapping[str, tuple[str, ...]] = {
    "in_proj": ("z", "x", "B", "C", "dt"),
    "conv1d": ("x", "B", "C"),
}
"""Modules whose ``weight`` (and ``conv1d``'s ``bias``) megatron-core's ``MambaMixer`` stores
one key per part (``<module>.weight.<part>``: Nemotron-H as Megatron-Bridge 0.6 writes it),
the parts' rows in this order, which is also the HF ``mixer.in_proj`` / ``conv1d`` order."""
ROW_PARTS: Mapping[str, tuple[str, ...]] = {
    "glu": GLU_HALVES,
    **SPLIT_MODULES,
    **{f"mamba_{module}": parts for module, parts in MAMBA_SPLIT_MODULES.items()},
}
"""Every set of row parts that makes one canonical tensor, each in row order."""
_GLU_HALF_KEYS = frozenset(f"{kind}_{half}" for kind in ("weight", "bias") for half in GLU_HALVES)


def gated_delta_net_row_parts(qk_rows: int, v_rows: int, v_heads: int) -> dict[str, RowParts]:
    """The row parts of a gated-delta-net layer, keyed by layer-relative name.

    ``qk_rows`` is ``linear_key_head_dim * linear_num_key_heads``, ``v_rows``
    ``linear_value_head_dim * linear_num_value_heads`` and ``v_heads``
    ``linear_num_value_heads``.
    """
    rows = {
        "query": qk_rows,
        "key": qk_rows,
        "value": v_rows,
        "z": v_rows,
        "beta": v_heads,
        "alpha": v_heads,
    }
    return {
        f"self_attention.{module}.weight": tuple((part, rows[part]) for part in parts)
        for module, parts in SPLIT_MODULES.items()
    }


def row_part_order(parts: Collection[str]) -> tuple[str, ...] | None:
    """The row order of a full set of row parts (of one :data:`ROW_PARTS` entry); None when
    ``parts`` is no such set (parts missing, or of different tensors)."""
    found = set(parts)
    return next((order for order in ROW_PARTS.values() if set(order) == found), None)


def split_row_part(name: str) -> tuple[str, str | None]:
    """``...linear_fc1.weight_w`` -> (``...linear_fc1.weight``, ``w``),
    ``...in_proj.weight.query`` -> (``...in_proj.weight``, ``query``); others (name, None)."""
    stem, _, last = name.rpartition(".")
    if stem.endswith("linear_fc1") and last in _GLU_HALF_KEYS:
        return f"{stem}.{last[:-2]}", last[-1]
    kind = stem.rpartition(".")[2]
    module = stem.rpartition(".")[0].rpartition(".")[2]
    parts = (*SPLIT_MODULES.get(module, ()), *MAMBA_SPLIT_MODULES.get(module, ()))
    if (kind == "weight" or (kind == "bias" and module == "conv1d")) and last in parts:
        return stem, last
    return name, None


# --- forward: canonical name -> sharded key (the writer) -------------------------------------


@dataclass(frozen=True)
class Layout:
    """What decides the sharded keys of a model's tensors (single rank: TP = PP = EP = 1)."""

    num_layers: int
    num_experts: int = 0
    stacked: bool = False
    """Decoder layers stacked under one key with a leading layer axis."""
    glu: bool = False
    """SwiGLU: every ``linear_fc1`` weight and bias is saved in ``[gate; up]`` fragments."""
    norms: NormSpec = NormSpec.LOCAL
    linear_layers: frozenset[int] = frozenset()
    """Decoder layers that are gated delta nets."""
    moe_layers: frozenset[int] = frozenset()
    """Decoder layers with a mixture of experts."""
    row_parts: Mapping[str, RowParts] = field(default_factory=dict)
    """Layer-relative name -> row parts of the tensors stored split by rows."""

    def fused_norms(self, layer: int) -> tuple[FusedNorm, ...]:
        """The norms decoder layer ``layer`` saves fused (the MTP layer is built like the
        last decoder layer)."""
        if self.norms is NormSpec.LOCAL:
            return LOCAL_SPEC_NORMS
        if self.norms is NormSpec.UNFUSED:
            return ()
        fused: tuple[FusedNorm, ...] = ()
        if self.norms is NormSpec.TE_GATED_DELTA_NET:
            fused = (IN_PROJ_INPUT_NORM if layer in self.linear_layers else QKV_INPUT_NORM,)
        if layer not in self.moe_layers:
            fused += (FC1_PRE_MLP_NORM,)
        return fused


@dataclass(frozen=True)
class Placement:
    """Where one canonical tensor goes in a torch_dist checkpoint."""

    key: str
    """Sharded key of the tensor (of each row part: ``<key>.<part>``)."""
    offsets: Offsets
    """Prepended axes: the layer axis (stacked decoder), then the expert axis."""
    glu_fc1: bool
    """Saved as two fragments (gate, up) along the first axis after the prepended ones."""
    row_parts: RowParts = ()
    """Stored as one key per part (``<key>.<part>``), each these many rows."""


DECODER_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
"""The prefix of a megatron-core decoder layer's names (``decoder.layers.7.``), the layer number
captured: the one spelling the Megatron readers, the writer and the checks match names by."""
_MTP_INNER = re.compile(r"(mtp\.layers\.\d+\.)(?:transformer_layer|mtp_model_layer)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(.+)")
_GLU_FC1 = re.compile(r"(?:^|\.)linear_fc1\.(?:weight|bias)$")


def _layer_inner(
    rest: str, layout: Layout, prepend: Offsets, name: str, layer: int
) -> tuple[str, Offsets]:
    """Sharded key (relative to the layer) and offsets of one name inside a layer."""
    expert = _EXPERT.fullmatch(rest)
    if expert:
        e = int(expert.group(1))
        if not 0 <= e < layout.num_experts:
            raise ValueError(f"{name}: expert {e} outside num_moe_experts={layout.num_experts}")
        rest = f"mlp.experts.experts.{expert.group(2)}"
        prepend = (*prepend, (len(prepend), e, layout.num_experts))
    for norm in layout.fused_norms(layer):
        if rest.startswith(norm.norm):
            rest = norm.fused + rest[len(norm.norm) :]
            break
    return rest, prepend


def to_sharded_key(name: str, layout: Layout) -> Placement:
    """The sharded key, prepended axes, SwiGLU fragments and row parts of a canonical name
    (``mtp_model_layer`` spelled either way) in a checkpoint of ``layout``.

    Raises ValueError for a layer or expert index outside the layout.
    """
    decoder = DECODER_LAYER.match(name)
    mtp = _MTP_INNER.fullmatch(name)
    if decoder and len(name) > decoder.end():  # a layer's tensor, not the bare prefix
        k = int(decoder.group(1))
        if not 0 <= k < layout.num_layers:
            raise ValueError(f"{name}: layer {k} outside num_layers={layout.num_layers}")
        rest = name[decoder.end() :]
        if layout.stacked:
            inner, offsets = _layer_inner(rest, layout, ((0, k, layout.num_layers),), name, k)
            key = f"decoder.layers.{inner}"
        else:
            inner, offsets = _layer_inner(rest, layout, (), name, k)
            key = f"decoder.layers.{k}.{inner}"
    elif mtp:
        rest = mtp.group(2)
        inner, offsets = _layer_inner(rest, layout, (), name, layout.num_layers - 1)
        key = f"{mtp.group(1)}transformer_layer.{inner}"
    else:
        return Placement(name, (), False)
    glu = layout.glu and bool(_GLU_FC1.search(inner))
    return Placement(key, offsets, glu, layout.row_parts.get(rest, ()))


# --- reverse: sharded key -> canonical name (the readers) ------------------------------------

HYBRID_FINAL_NORM = "decoder.final_norm."
"""The final norm of megatron-core's hybrid (Mamba) stack; GPTModel's ``final_layernorm``."""
_MTP_SPELLING = re.compile(r"(^|\.)mtp\.layers\.(\d+)\.mtp_model_layer\.")
_UNFUSED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(rf"\.{re.escape(f.fused)}(weight|bias)$"), rf".{f.norm}\1") for f in FUSED_NORMS
)


def canonical_name(name: str) -> str:
    """The canonical spelling of one tensor name: ``transformer_layer`` for
    ``mtp_model_layer``, ``final_layernorm`` for the hybrid stack's ``final_norm``, and every
    fused norm of :data:`FUSED_NORMS` unfused."""
    name = _MTP_SPELLING.sub(r"\1mtp.layers.\2.transformer_layer.", name)
    if name.startswith(HYBRID_FINAL_NORM):  # megatron-core's hybrid stack
        name = "decoder.final_layernorm." + name[len(HYBRID_FINAL_NORM) :]
    for pattern, replacement in _UNFUSED:
        name = pattern.sub(replacement, name)
    return name


@dataclass(frozen=True)
class KeyTemplate:
    """A sharded key as name parts, with the positions its prepended axes' indices fill."""

    parts: tuple[str, ...]
    slots: tuple[int, ...]
    """Positions in ``parts`` of the layer index, then the expert index, as far as the key
    has those axes."""

    @classmethod
    def of(cls, key: str, ndim: int | None = None) -> KeyTemplate:
        """The template of ``key``: the first ``layers`` not followed by an index takes one
        (a stacked decoder), the first ``experts.experts`` becomes ``experts.local_experts``
        and takes one unless an index follows (a singleton-shard save). Given ``ndim``, the
        stored tensor's dimensions, a key that would take more indices than that has no
        prepended axes and keeps its parts as they are."""
        parts = key.split(".")
        slots: list[int] = []
        for i, part in enumerate(parts[:-1]):
            if part == "layers":
                if not parts[i + 1].isdigit():
                    parts.insert(i + 1, "")
                    slots.append(i + 1)
                break
        for i in range(len(parts) - 2):
            if parts[i] == "experts" and parts[i + 1] == "experts":
                parts[i + 1] = "local_experts"
                if not parts[i + 2].isdigit():
                    parts.insert(i + 2, "")
                    slots.append(i + 2)
                break
        if ndim is not None and len(slots) > ndim:
            return cls(tuple(key.split(".")), ())
        return cls(tuple(parts), tuple(slots))

    @property
    def axes(self) -> int:
        """Number of prepended axes."""
        return len(self.slots)

    def name(self, indices: Sequence[int]) -> tuple[str, str | None]:
        """The canonical name at ``indices`` of the prepended axes, and the row part the key
        holds of it (:func:`split_row_part`; None for a whole tensor)."""
        parts = list(self.parts)
        for slot, index in zip(self.slots, indices, strict=True):
            parts[slot] = str(index)
        return split_row_part(canonical_name(".".join(parts)))


def from_sharded_key(key: str, indices: Sequence[int] = ()) -> tuple[str, str | None]:
    """The canonical name (and row part) of ``key`` at ``indices`` of its prepended axes.

    Raises ValueError unless there is one index per prepended axis of the key.
    """
    template = KeyTemplate.of(key)
    if len(indices) != template.axes:
        raise ValueError(f"{key} has {template.axes} prepended axes, got indices {indices}")
    return template.name(indices)
