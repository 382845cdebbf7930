"""Canonical state_dict names and shapes of the megatron-core ``GPTModel`` an HF config
describes (``expected_layer_names``, ``expected_mtp_layer_names``, ``expected_model_names``),
for the layer spec megatron-core uses for the family (:mod:`mtpcheck.convert.megatron_config`).

Names of one decoder layer, relative to ``decoder.layers.{k}.`` (``h`` hidden size, ``nq``/``ng``
query heads/groups, ``d`` head dim, ``f`` dense FFN, ``E`` experts, ``fe``/``fs`` expert/shared
FFN). The inner layer of ``mtp.layers.{i}.transformer_layer.`` is built from the spec of the
*last* decoder layer, so it has that layer's names.

* GQA attention, local spec: ``input_layernorm.weight (h)``,
  ``self_attention.linear_qkv.weight ((nq+2ng)d, h)`` (+ ``.bias`` with q/k/v bias; rows are
  grouped per query group: ``[q of group g, k_g, v_g]``), ``self_attention.q_layernorm.weight
  (d)``, ``self_attention.k_layernorm.weight (d)`` (qk-norm only),
  ``self_attention.linear_proj.weight (h, nq d)``. Transformer Engine spec: no
  ``input_layernorm``; ``self_attention.linear_qkv.layer_norm_weight (h)`` instead. With an
  output gate (Qwen3-Next) ``linear_qkv`` has ``(2nq+2ng)d`` rows, per group
  ``[q, gate, k, v]``.
* MLA attention, local spec: ``input_layernorm.weight (h)``,
  ``self_attention.linear_q_down_proj.weight (q_lora, h)``,
  ``self_attention.linear_q_up_proj.weight (nq(qk+rope), q_lora)``,
  ``self_attention.q_layernorm.weight (q_lora)``,
  ``self_attention.linear_kv_down_proj.weight (kv_lora+rope, h)``,
  ``self_attention.linear_kv_up_proj.weight (nq(qk+v), kv_lora)``,
  ``self_attention.kv_layernorm.weight (kv_lora)``, ``self_attention.linear_proj.weight
  (h, nq v)``; without ``q_lora_rank`` a single ``linear_q_proj.weight (nq(qk+rope), h)``.
  Transformer Engine spec (Megatron-Bridge): the two norms are fused as
  ``linear_q_up_proj.layer_norm_weight`` and ``linear_kv_up_proj.layer_norm_weight``.
* Gated delta net (Qwen3-Next linear attention, Transformer Engine spec only):
  ``self_attention.in_proj.weight (2qk+2v+2nv, h)`` with rows ``[q, k, v, z, beta, alpha]``,
  ``self_attention.in_proj.layer_norm_weight (h)`` (the fused input norm),
  ``self_attention.conv1d.weight (2qk+v, 1, kernel)``, ``self_attention.dt_bias (nv)``,
  ``self_attention.A_log (nv)``, ``self_attention.out_norm.weight (dv)``,
  ``self_attention.out_proj.weight (h, v)``; ``qk = key_head_dim * linear_num_key_heads``,
  ``v = value_head_dim * linear_num_value_heads``, ``nv = linear_num_value_heads``. On disk
  ``in_proj.weight`` becomes six keys ``in_proj.weight.{query,key,value,z,beta,alpha}`` and
  ``conv1d.weight`` three keys ``conv1d.weight.{query,key,value}``.
* Dense MLP: ``pre_mlp_layernorm.weight (h)`` (Transformer Engine:
  ``mlp.linear_fc1.layer_norm_weight``), ``mlp.linear_fc1.weight (2f, h)`` rows ``[gate; up]``,
  ``mlp.linear_fc2.weight (h, f)``.
* MoE: ``pre_mlp_layernorm.weight (h)`` (both specs), ``mlp.router.weight (E, h)``,
  ``mlp.router.expert_bias (E)`` (fp32, with expert bias),
  ``mlp.experts.local_experts.{e}.linear_fc1.weight (2fe, h)`` ``[gate; up]``,
  ``mlp.experts.local_experts.{e}.linear_fc2.weight (h, fe)`` (Transformer Engine grouped GEMM
  names them ``mlp.experts.linear_fc1.weight{e}``), ``mlp.shared_experts.linear_fc1.weight
  (2fs, h)``, ``mlp.shared_experts.linear_fc2.weight (h, fs)``,
  ``mlp.shared_experts.gate_weight (1, h)`` (Qwen3-Next's shared-expert gate).
* MTP layer ``mtp.layers.{i}.``: ``enorm.weight (h)``, ``hnorm.weight (h)``,
  ``eh_proj.weight (h, 2h)`` columns ``[embedding | hidden]``, ``final_layernorm.weight (h)``.

On disk (torch_dist) the local spec of a non-MLA layer renames ``input_layernorm.`` to
``self_attention.linear_qkv.layer_norm_`` and ``pre_mlp_layernorm.`` to
``mlp.linear_fc1.layer_norm_``; the local MLA spec renames nothing
(:mod:`mtpcheck.formats.torch_dist_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtpcheck.convert.megatron_config import (
    Shape,
    family_info,
    gpt_model_kwargs,
    layer_pattern,
    shares_indexer,
    transformer_config_kwargs,
)


def _attention_names(kw: Mapping[str, Any], spec: str, linear: bool) -> dict[str, Shape]:
    h = int(kw["hidden_size"])
    if linear:
        return _gated_delta_net_names(kw)
    if kw.get("multi_latent_attention"):
        return _mla_names(kw, spec)
    nq, ng, d = int(kw["num_attention_heads"]), int(kw["num_query_groups"]), int(kw["kv_channels"])
    rows = (nq + 2 * ng) * d + (nq * d if kw.get("attention_output_gate") else 0)
    out: dict[str, Shape] = {}
    if spec == "local":
        out["input_layernorm.weight"] = (h,)
    else:
        out["self_attention.linear_qkv.layer_norm_weight"] = (h,)
    out["self_attention.linear_qkv.weight"] = (rows, h)
    if kw.get("add_qkv_bias") or kw.get("add_bias_linear"):
        out["self_attention.linear_qkv.bias"] = (rows,)
    if kw.get("qk_layernorm"):
        out["self_attention.q_layernorm.weight"] = (d,)
        out["self_attention.k_layernorm.weight"] = (d,)
    out["self_attention.linear_proj.weight"] = (h, nq * d)
    if kw.get("add_bias_linear"):
        out["self_attention.linear_proj.bias"] = (h,)
    return out


def _mla_names(kw: Mapping[str, Any], spec: str) -> dict[str, Shape]:
    h, nq = int(kw["hidden_size"]), int(kw["num_attention_heads"])
    q_lora, kv_lora = kw.get("q_lora_rank"), int(kw["kv_lora_rank"])
    qk, rope, v = int(kw["qk_head_dim"]), int(kw["qk_pos_emb_head_dim"]), int(kw["v_head_dim"])
    norms = bool(kw.get("qk_layernorm"))
    dsa = kw.get("experimental_attention_variant") == "dsa"
    if dsa:
        spec = "local"  # megatron-core's DSA spec keeps the q / kv norms standalone
    p = "self_attention."
    out: dict[str, Shape] = {"input_layernorm.weight": (h,)}
    if q_lora:
        out[p + "linear_q_down_proj.weight"] = (int(q_lora), h)
        out[p + "linear_q_up_proj.weight"] = (nq * (qk + rope), int(q_lora))
        if norms:
            key = "q_layernorm.weight" if spec == "local" else "linear_q_up_proj.layer_norm_weight"
            out[p + key] = (int(q_lora),)
    else:
        out[p + "linear_q_proj.weight"] = (nq * (qk + rope), h)
    out[p + "linear_kv_down_proj.weight"] = (kv_lora + rope, h)
    out[p + "linear_kv_up_proj.weight"] = (nq * (qk + v), kv_lora)
    if norms:
        key = "kv_layernorm.weight" if spec == "local" else "linear_kv_up_proj.layer_norm_weight"
        out[p + key] = (kv_lora,)
    out[p + "linear_proj.weight"] = (h, nq * v)
    if dsa:
        heads, dim = int(kw["dsa_indexer_n_heads"]), int(kw["dsa_indexer_head_dim"])
        i = p + "core_attention.indexer."
        out[i + "linear_wq_b.weight"] = (heads * dim, int(q_lora or h))
        out[i + "linear_wk.weight"] = (dim, h)
        out[i + "k_norm.weight"] = (dim,)
        out[i + "k_norm.bias"] = (dim,)
        out[i + "linear_weights_proj.weight"] = (heads, h)
    return out


def _gated_delta_net_names(kw: Mapping[str, Any]) -> dict[str, Shape]:
    h = int(kw["hidden_size"])
    nk, nv = int(kw["linear_num_key_heads"]), int(kw["linear_num_value_heads"])
    qk = int(kw["linear_key_head_dim"]) * nk
    dv = int(kw["linear_value_head_dim"])
    v = dv * nv
    p = "self_attention."
    return {
        p + "in_proj.weight": (2 * qk + 2 * v + 2 * nv, h),
        p + "in_proj.layer_norm_weight": (h,),
        p + "conv1d.weight": (2 * qk + v, 1, int(kw["linear_conv_kernel_dim"])),
        p + "dt_bias": (nv,),
        p + "A_log": (nv,),
        p + "out_norm.weight": (dv,),
        p + "out_proj.weight": (h, v),
    }


def _mlp_names(kw: Mapping[str, Any], spec: str, moe: bool) -> dict[str, Shape]:
    h = int(kw["hidden_size"])
    glu = 2 if kw.get("gated_linear_unit") else 1
    out: dict[str, Shape] = {}
    if not moe:
        f = int(kw["ffn_hidden_size"])
        if spec == "local":
            out["pre_mlp_layernorm.weight"] = (h,)
        else:
            out["mlp.linear_fc1.layer_norm_weight"] = (h,)
        out["mlp.linear_fc1.weight"] = (glu * f, h)
        out["mlp.linear_fc2.weight"] = (h, f)
        return out
    experts, fe = int(kw["num_moe_experts"]), int(kw["moe_ffn_hidden_size"])
    out["pre_mlp_layernorm.weight"] = (h,)
    out["mlp.router.weight"] = (experts, h)
    if kw.get("moe_router_enable_expert_bias"):
        out["mlp.router.expert_bias"] = (experts,)
    for e in range(experts):
        out[f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = (glu * fe, h)
        out[f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = (h, fe)
    fs = kw.get("moe_shared_expert_intermediate_size")
    if fs:
        out["mlp.shared_experts.linear_fc1.weight"] = (glu * int(fs), h)
        out["mlp.shared_experts.linear_fc2.weight"] = (h, int(fs))
        if kw.get("moe_shared_expert_gate"):
            out["mlp.shared_experts.gate_weight"] = (1, h)
    return out


def _resolve_spec(family_key: str, spec: str | None) -> str:
    family = family_info(family_key)
    spec = spec or family.spec
    if spec not in ("local", "te"):
        raise ValueError(f"spec must be 'local' or 'te', not {spec!r}")
    if family.spec == "te" and spec == "local":
        raise ValueError(f"{family_key} has no local (non Transformer Engine) layer spec")
    return spec


def expected_layer_names(
    family_key: str, hf_config: Mapping[str, Any], layer: int = 0, *, spec: str | None = None
) -> dict[str, Shape]:
    """Canonical state_dict names and shapes of decoder layer ``layer``, relative to its prefix.

    ``spec`` is ``local`` (``get_gpt_layer_local_spec``; the canonical contract) or ``te``
    (Transformer Engine, as Megatron-Bridge builds the family); the default is the family's
    spec (``te`` only for Qwen3-Next, which has no local spec).
    """
    spec = _resolve_spec(family_key, spec)
    kw = transformer_config_kwargs(hf_config, family_key)
    n = int(kw["num_layers"])
    if not 0 <= layer < n:
        raise ValueError(f"layer {layer} out of range for {n} decoder layers")
    linear = layer_pattern(kw, "linear_attention_freq")[layer] == 1
    moe = kw.get("num_moe_experts") is not None and layer_pattern(kw, "moe_layer_freq")[layer]
    names = {**_attention_names(kw, spec, linear), **_mlp_names(kw, spec, bool(moe))}
    if shares_indexer(hf_config, layer):
        names = {k: v for k, v in names.items() if ".core_attention.indexer." not in k}
    return names


def expected_mtp_layer_names(
    family_key: str, hf_config: Mapping[str, Any], *, spec: str | None = None
) -> dict[str, Shape]:
    """Names of one MTP layer relative to ``mtp.layers.{i}.`` (inner layer = last decoder layer)."""
    kw = transformer_config_kwargs(hf_config, family_key)
    h = int(kw["hidden_size"])
    inner = expected_layer_names(family_key, hf_config, int(kw["num_layers"]) - 1, spec=spec)
    return {
        "enorm.weight": (h,),
        "hnorm.weight": (h,),
        "eh_proj.weight": (h, 2 * h),
        **{f"transformer_layer.{k}": v for k, v in inner.items()},
        "final_layernorm.weight": (h,),
    }


def expected_model_names(
    family_key: str,
    hf_config: Mapping[str, Any],
    *,
    spec: str | None = None,
    padded_vocab_size: int | None = None,
) -> dict[str, Shape]:
    """Every canonical tensor name and shape of the whole ``GPTModel`` including MTP."""
    kw = transformer_config_kwargs(hf_config, family_key)
    model = gpt_model_kwargs(hf_config, family_key)
    h, vocab = int(kw["hidden_size"]), int(padded_vocab_size or model["vocab_size"])
    out: dict[str, Shape] = {"embedding.word_embeddings.weight": (vocab, h)}
    for k in range(int(kw["num_layers"])):
        layer = expected_layer_names(family_key, hf_config, k, spec=spec)
        out.update({f"decoder.layers.{k}.{name}": shape for name, shape in layer.items()})
    out["decoder.final_layernorm.weight"] = (h,)
    mtp = expected_mtp_layer_names(family_key, hf_config, spec=spec)
    for i in range(int(kw.get("mtp_num_layers") or 0)):
        out.update({f"mtp.layers.{i}.{name}": shape for name, shape in mtp.items()})
    if not model["share_embeddings_and_output_weights"]:
        out["output_layer.weight"] = (vocab, h)
    return out
