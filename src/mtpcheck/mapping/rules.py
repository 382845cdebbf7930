"""HF <-> Megatron name rules for one decoder layer, and for the MTP wrapper, as data.

Names on the Megatron side are mtpcheck's canonical Megatron names: what a megatron-core
``GPTModel`` built with the local layer spec returns from ``state_dict()`` (one tensor per
layer and per expert). ``{e}`` stands for an expert index.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mtpcheck.layouts import MegatronLayout


class Kind(str, enum.Enum):
    """How HF source tensors become one Megatron tensor (every kind is invertible; all but
    ``ZERO_CENTRED`` bit for bit)."""

    COPY = "copy"
    CONCAT_ROWS = "concat_rows"
    """``[gate; up]`` SwiGLU fc1: HF parts stacked along rows, split back in equal parts."""
    QKV = "qkv"
    """Grouped-query interleave of q, k, v (see :mod:`mtpcheck.mapping.transforms`)."""
    SWAP_HALVES = "swap_halves"
    """Projection whose two input halves are in the opposite order (MiMo)."""
    GDN_IN_PROJ = "gdn_in_proj"
    """Gated delta net: HF ``in_proj_qkvz`` + ``in_proj_ba`` regrouped into megatron-core's
    fused ``in_proj`` (see :class:`mtpcheck.mapping.transforms.Gdn`)."""
    ZERO_CENTRED = "zero_centred"
    """A norm Megatron stores zero-centred: ``w - 1`` (megatron-core builds the gated delta
    net's ``out_norm`` with ``layernorm_zero_centered_gamma``, which Megatron-Bridge sets for
    Qwen3-Next and Qwen3.5, whose HF gated norm multiplies by ``w`` itself). Arithmetic, the
    one kind that is not bit-exact for every value (``transforms.add_to_values``)."""
    GDN_SPLIT_IN_PROJ = "gdn_split_in_proj"
    """Gated delta net: HF ``in_proj_qkv`` (flat ``[q; k; v]``), ``in_proj_z``, ``in_proj_b``
    and ``in_proj_a`` stacked by rows into megatron-core's fused ``in_proj``, which is
    ``[q; k; v; z; beta; alpha]`` head-major (Qwen3.5; row counts from the config)."""
    GDN_HEAD_GROUPED = "gdn_head_grouped"
    """Gated delta net in mcore-bridge's layout: the HF tensors' flat pieces regrouped key head
    by key head (``in_proj``: ``[q_h; k_h; v_h; z_h; b_h; a_h]``, ``conv1d``: ``[q_h; k_h;
    v_h]``; :func:`mtpcheck.mapping.transforms.head_grouped_to_megatron`)."""
    FUSED_EXPERT = "fused_expert"
    """One expert of an HF tensor that stacks every routed expert (transformers 5's
    ``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, rows ``[gate; up]`` per expert, and
    ``mlp.experts.down_proj`` ``[E, H, I]``): the Megatron tensor is slice ``e``, a
    contiguous byte range. HF side only: from Megatron, experts are mapped one by one."""


@dataclass(frozen=True)
class LayerRule:
    """One Megatron tensor of a decoder layer and the HF tensors it comes from."""

    hf: tuple[str, ...]
    megatron: str
    kind: Kind = Kind.COPY
    requires: tuple[str, ...] = ()
    """Further HF names (relative) that must exist for the rule to apply."""
    when: str = ""
    """Only for layers with these traits (``+``-joined): ``mla`` / ``gqa`` attention,
    ``shared_experts`` / ``shared_expert`` naming, ``gdn_fused`` / ``gdn_split`` projections,
    the :class:`MegatronLayout` (``megatron-core`` / ``mcore-bridge``); several HF names share
    one Megatron name across traits."""


_R = LayerRule
_QKV = Kind.QKV
_CAT = Kind.CONCAT_ROWS
_GDN = "self_attention."
_CORE = MegatronLayout.MEGATRON_CORE.value
_SWIFT = MegatronLayout.MCORE_BRIDGE.value
_QKVZ_BA = ("linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight")
_QKV_Z_B_A = tuple(f"linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a"))
_DSA_INDEXER = (
    ("wq_b.weight", "linear_wq_b.weight"),
    ("wk.weight", "linear_wk.weight"),
    ("k_norm.weight", "k_norm.weight"),
    ("k_norm.bias", "k_norm.bias"),
    ("weights_proj.weight", "linear_weights_proj.weight"),
)
"""The DSA indexer's tensors: (HF name under ``self_attn.indexer.``, megatron-core's under
``self_attention.core_attention.indexer.``)."""

DECODER_RULES: tuple[LayerRule, ...] = (
    _R(("input_layernorm.weight",), "input_layernorm.weight"),
    _R(("post_attention_layernorm.weight",), "pre_mlp_layernorm.weight"),
    # grouped-query attention (GLM-4.5, Qwen2/MiMo, Qwen3-Next full attention)
    _R(
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "self_attention.linear_qkv.weight",
        _QKV,
    ),
    _R(
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "self_attention.linear_qkv.bias",
        _QKV,
    ),
    _R(("self_attn.o_proj.weight",), "self_attention.linear_proj.weight"),
    _R(("self_attn.q_norm.weight",), "self_attention.q_layernorm.weight", when="gqa"),
    _R(("self_attn.k_norm.weight",), "self_attention.k_layernorm.weight", when="gqa"),
    # multi-latent attention (DeepSeek-V3, GLM-5)
    _R(("self_attn.q_a_proj.weight",), "self_attention.linear_q_down_proj.weight"),
    _R(("self_attn.q_a_layernorm.weight",), "self_attention.q_layernorm.weight", when="mla"),
    _R(("self_attn.q_b_proj.weight",), "self_attention.linear_q_up_proj.weight"),
    _R(
        ("self_attn.q_proj.weight",),
        "self_attention.linear_q_proj.weight",
        requires=("self_attn.kv_a_proj_with_mqa.weight",),
    ),
    _R(("self_attn.kv_a_proj_with_mqa.weight",), "self_attention.linear_kv_down_proj.weight"),
    _R(("self_attn.kv_a_layernorm.weight",), "self_attention.kv_layernorm.weight"),
    _R(("self_attn.kv_b_proj.weight",), "self_attention.linear_kv_up_proj.weight"),
    # DSA indexer of GLM-5 / DeepSeek-V3.2 (megatron-core
    # transformer/experimental_attention_variant/dsa.py, ``DSAIndexer``)
    *(
        _R((f"self_attn.indexer.{hf}",), f"self_attention.core_attention.indexer.{megatron}")
        for hf, megatron in _DSA_INDEXER
    ),
    # gated delta net (Qwen3-Next linear attention; megatron-core ssm/gated_delta_net.py)
    _R(_QKVZ_BA, _GDN + "in_proj.weight", Kind.GDN_IN_PROJ, when="gdn_fused+" + _CORE),
    _R(_QKVZ_BA, _GDN + "in_proj.weight", Kind.GDN_HEAD_GROUPED, when="gdn_fused+" + _SWIFT),
    # Qwen3.5's four separate projections (Megatron-Bridge 0.6 GDNLinearMappingSeparate)
    _R(_QKV_Z_B_A, _GDN + "in_proj.weight", Kind.GDN_SPLIT_IN_PROJ, when="gdn_split+" + _CORE),
    _R(_QKV_Z_B_A, _GDN + "in_proj.weight", Kind.GDN_HEAD_GROUPED, when="gdn_split+" + _SWIFT),
    _R(("linear_attn.conv1d.weight",), _GDN + "conv1d.weight", when=_CORE),
    _R(("linear_attn.conv1d.weight",), _GDN + "conv1d.weight", Kind.GDN_HEAD_GROUPED, when=_SWIFT),
    _R(("linear_attn.A_log",), _GDN + "A_log"),
    _R(("linear_attn.dt_bias",), _GDN + "dt_bias"),
    _R(("linear_attn.norm.weight",), _GDN + "out_norm.weight", Kind.ZERO_CENTRED, when=_CORE),
    _R(("linear_attn.norm.weight",), _GDN + "out_norm.weight", when=_SWIFT),
    _R(("linear_attn.out_proj.weight",), _GDN + "out_proj.weight"),
    # dense SwiGLU MLP
    _R(("mlp.gate_proj.weight", "mlp.up_proj.weight"), "mlp.linear_fc1.weight", _CAT),
    _R(("mlp.down_proj.weight",), "mlp.linear_fc2.weight"),
    # mixture of experts
    _R(("mlp.gate.weight",), "mlp.router.weight"),
    _R(("mlp.gate.e_score_correction_bias",), "mlp.router.expert_bias"),
    _R(
        ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
        "mlp.experts.local_experts.{e}.linear_fc1.weight",
        _CAT,
    ),
    _R(("mlp.experts.{e}.down_proj.weight",), "mlp.experts.local_experts.{e}.linear_fc2.weight"),
    _R(
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
        "mlp.shared_experts.linear_fc1.weight",
        _CAT,
        when="shared_experts",
    ),
    _R(
        ("mlp.shared_experts.down_proj.weight",),
        "mlp.shared_experts.linear_fc2.weight",
        when="shared_experts",
    ),
    # Qwen names the shared expert in the singular and gates it
    _R(
        ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"),
        "mlp.shared_experts.linear_fc1.weight",
        _CAT,
        when="shared_expert",
    ),
    _R(
        ("mlp.shared_expert.down_proj.weight",),
        "mlp.shared_experts.linear_fc2.weight",
        when="shared_expert",
    ),
    _R(("mlp.shared_expert_gate.weight",), "mlp.shared_experts.gate_weight", when="shared_expert"),
)

_M = "mixer."
HYBRID_RULES: tuple[LayerRule, ...] = (
    # Mamba layers: megatron-core's MambaLayer keeps the HF names under ``mixer.``
    _R(("norm.weight",), "norm.weight", when="mamba"),
    *(
        _R((_M + name,), _M + name, when="mamba")
        for name in (
            "in_proj.weight",
            "conv1d.weight",
            "conv1d.bias",
            "A_log",
            "D",
            "dt_bias",
            "norm.weight",
            "out_proj.weight",
        )
    ),
    # attention layers
    _R(("norm.weight",), "input_layernorm.weight", when="attention"),
    _R(
        (_M + "q_proj.weight", _M + "k_proj.weight", _M + "v_proj.weight"),
        "self_attention.linear_qkv.weight",
        _QKV,
        when="attention",
    ),
    _R((_M + "o_proj.weight",), "self_attention.linear_proj.weight", when="attention"),
    # mixture of non-gated (squared-ReLU) experts
    _R(("norm.weight",), "pre_mlp_layernorm.weight", when="moe"),
    _R((_M + "gate.weight",), "mlp.router.weight", when="moe"),
    _R((_M + "gate.e_score_correction_bias",), "mlp.router.expert_bias", when="moe"),
    _R((_M + "experts.{e}.up_proj.weight",), "mlp.experts.local_experts.{e}.linear_fc1.weight"),
    _R((_M + "experts.{e}.down_proj.weight",), "mlp.experts.local_experts.{e}.linear_fc2.weight"),
    _R((_M + "shared_experts.up_proj.weight",), "mlp.shared_experts.linear_fc1.weight", when="moe"),
    _R(
        (_M + "shared_experts.down_proj.weight",),
        "mlp.shared_experts.linear_fc2.weight",
        when="moe",
    ),
    # dense non-gated MLP layers
    _R(("norm.weight",), "pre_mlp_layernorm.weight", when="mlp"),
    _R((_M + "up_proj.weight",), "mlp.linear_fc1.weight", when="mlp"),
    _R((_M + "down_proj.weight",), "mlp.linear_fc2.weight", when="mlp"),
)
"""Nemotron-H's layers (HF ``backbone.layers.{k}.``: one ``norm`` and one ``mixer``, of the
kind the hybrid pattern gives) and megatron-core's hybrid stack, as Megatron-Bridge 0.6's
``nemotron_h_bridge.py`` maps them. ``when`` is the layer's kind, told by its tensors
(:data:`HYBRID_KIND_MARKERS`)."""
HYBRID_KIND_MARKERS: tuple[tuple[str, str, str], ...] = (
    ("mamba", _M + "in_proj.weight", _M + "in_proj.weight"),
    ("attention", _M + "q_proj.weight", "self_attention.linear_qkv.weight"),
    ("moe", _M + "gate.weight", "mlp.router.weight"),
    ("mlp", _M + "up_proj.weight", "mlp.linear_fc1.weight"),
)
"""(kind, HF tensor, Megatron tensor) whose presence in a hybrid layer tells its kind."""

FUSED_EXPERT_RULES: tuple[tuple[str, str], ...] = (
    ("mlp.experts.gate_up_proj", "mlp.experts.local_experts.{e}.linear_fc1.weight"),
    ("mlp.experts.down_proj", "mlp.experts.local_experts.{e}.linear_fc2.weight"),
)
"""(HF fused experts, Megatron per-expert name) of :attr:`Kind.FUSED_EXPERT`."""

TOP_LEVEL_MEGATRON = (
    "embedding.word_embeddings.weight",
    "decoder.final_layernorm.weight",
    "output_layer.weight",
)
"""Megatron's embedding, final norm and output head: a family's ``main_shared[0]``,
``main_norm`` and ``main_shared[1]`` (:func:`top_level`)."""


def top_level(main_shared: tuple[str, ...], main_norm: str) -> tuple[tuple[str, str], ...]:
    """(HF name, Megatron name) of the embedding, final norm and output head."""
    embed, head = main_shared
    return tuple(zip((embed, main_norm, head), TOP_LEVEL_MEGATRON, strict=True))


MEGATRON_MTP_WRAPPER = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight")
"""MTP-only tensors of a Megatron MTP layer, relative to ``mtp.layers.{i}.``."""
