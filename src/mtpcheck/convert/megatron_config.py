"""Megatron-core 0.16.1 model description of an HF config: config kwargs, args, layer layout.

Everything here is derived from the HF ``config.json`` dict of one family and is data: the
keyword arguments of megatron-core's ``TransformerConfig`` (``transformer_config_kwargs``), the
Megatron-LM ``args`` namespace a checkpoint's ``common.pt`` carries (``args_namespace``),
``layer_pattern`` and the torch_dist key layout (``torch_dist_layout``); the canonical
state_dict names and shapes a ``GPTModel`` of that config holds are in
:mod:`mtpcheck.convert.megatron_names`.

Canonical names are what ``GPTModel.state_dict()`` returns, minus ``_extra_state`` entries, for
the layer spec megatron-core uses for the family. Which families are written, under which
layout, with which spec (``local`` or ``te``) and whether megatron-core builds the model on CPU
torch is each family record's ``support.writer`` (``MegatronWriter``), listed in the table
generated from the records on the convert page
(docs/commands/convert.md, "Families the built-in converter writes"); each layout's keyword
arguments are :data:`LAYOUT_KWARGS`. Whether torch_dist stacks the decoder's layers under one
key is decided per config (:func:`uses_stacked_layers`: homogeneous layers stack, a
``moe_layer_freq`` or ``linear_attention_freq`` list does not).

MTP layers are always written per index (``mtp.layers.{i}.…``), never stacked.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from mtpcheck.errors import ConfigKeyError, shown
from mtpcheck.families import FAMILIES, declared_count, detect_family
from mtpcheck.families.interface import MegatronWriter
from mtpcheck.formats.torch_dist_keys import (
    Layout,
    NormSpec,
    RowParts,
    gated_delta_net_row_parts,
)
from mtpcheck.model.config_keys import TEXT_CONFIG, is_int

Shape = tuple[int, ...]


TE_VARIANTS = ("gated_delta_net", "dsa")
"""megatron-core's experimental attention variants (Transformer Engine specs) written here."""


def layouts() -> dict[str, MegatronWriter]:
    """Every megatron-core layout the writer knows, by key, in registry order: the writer
    settings of each family written under its own key (others, like Kimi-K2, borrow one)."""
    writers = {f.key: f.support.writer for f in FAMILIES}
    return {k: w for k, w in writers.items() if w is not None and w.layout == k}


def family_info(family_key: str) -> MegatronWriter:
    """The writer settings of the megatron-core layout ``family_key``."""
    known = layouts()
    if family_key not in known:
        raise ValueError(
            f"no Megatron description for family {family_key!r}; known: {sorted(known)}"
        )
    return known[family_key]


def _text_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = hf_config.get(TEXT_CONFIG)
    if isinstance(inner, Mapping) and "num_hidden_layers" not in hf_config:
        return inner
    return hf_config


NEEDED_BY = "megatron-core's model of it"
"""Who needs the config keys read here, as a :class:`~mtpcheck.errors.ConfigKeyError` says."""


def _need(cfg: Mapping[str, Any], key: str) -> int:
    """The integer ``key`` of a (language model's) config, which megatron-core's model of it
    needs (a :class:`~mtpcheck.errors.ConfigKeyError` where it lacks one)."""
    value = cfg.get(key)
    if value is None:
        raise ConfigKeyError(key, NEEDED_BY)
    if not is_int(value):
        raise ConfigKeyError(key, NEEDED_BY, found=shown(value))
    return int(value)


def _mtp_count(hf_config: Mapping[str, Any]) -> int | None:
    """The MTP count as every check reads it (the family's count keys, then the count its
    loaders assume: one for Qwen3-Next, whose configs declare none); None for none."""
    return declared_count(hf_config, detect_family(hf_config), None).value or None


def _dtype_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    if name in ("float16", "half"):
        return {"fp16": True, "bf16": False, "params_dtype": torch.float16}
    if name in ("float32", "float"):
        return {"fp16": False, "bf16": False, "params_dtype": torch.float32}
    return {"fp16": False, "bf16": True, "params_dtype": torch.bfloat16}


def _moe_layer_freq(num_layers: int, first_dense: int) -> list[int]:
    return [0 if k < first_dense else 1 for k in range(num_layers)]


def _deepseek_style_moe(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """MoE of DeepSeek-V3 and GLM-4.5: sigmoid router with expert bias, shared experts."""
    shared = int(cfg.get("n_shared_experts") or 0)
    return {
        "num_moe_experts": _need(cfg, "n_routed_experts"),
        "moe_ffn_hidden_size": _need(cfg, "moe_intermediate_size"),
        "moe_router_topk": _need(cfg, "num_experts_per_tok"),
        "moe_layer_freq": _moe_layer_freq(num_layers, int(cfg.get("first_k_dense_replace", 0))),
        "moe_shared_expert_intermediate_size": (
            _need(cfg, "moe_intermediate_size") * shared if shared else None
        ),
        "moe_router_enable_expert_bias": True,
        "moe_router_score_function": "sigmoid",
        "moe_router_topk_scaling_factor": float(cfg.get("routed_scaling_factor", 1.0)),
        "moe_router_num_groups": int(cfg.get("n_group") or 1),
        "moe_router_group_topk": int(cfg.get("topk_group") or 1),
        "moe_router_dtype": "fp32",
        "moe_grouped_gemm": False,
        "moe_aux_loss_coeff": 0.0,
    }


def _qwen3_next_moe(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    experts = int(cfg.get("num_experts") or 0)
    if not experts:
        return {}
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense_only = set(cfg.get("mlp_only_layers") or ())
    freq = [1 if k not in dense_only and (k + 1) % step == 0 else 0 for k in range(num_layers)]
    shared = int(cfg.get("shared_expert_intermediate_size") or 0)
    return {
        "num_moe_experts": experts,
        "moe_ffn_hidden_size": _need(cfg, "moe_intermediate_size"),
        "moe_router_topk": _need(cfg, "num_experts_per_tok"),
        "moe_layer_freq": freq,
        "moe_shared_expert_intermediate_size": shared or None,
        "moe_shared_expert_gate": bool(shared),
        "moe_router_score_function": "softmax",
        "moe_router_dtype": "fp32",
        "moe_grouped_gemm": False,
        "moe_aux_loss_coeff": 0.0,
    }


def transformer_config_kwargs(hf_config: Mapping[str, Any], family_key: str) -> dict[str, Any]:
    """Keyword arguments of megatron-core's ``TransformerConfig`` for an HF config.

    The result builds a ``TransformerConfig`` (``MLATransformerConfig`` when
    ``multi_latent_attention`` is set, see ``transformer_config_class``) on CPU with
    ``use_cpu_initialization``. Decoder-layer patterns are lists (``moe_layer_freq``, and
    ``linear_attention_freq`` for Qwen3-Next), as Megatron-Bridge writes them.
    """
    family_info(family_key)
    cfg = _text_config(hf_config)
    num_layers = _need(cfg, "num_hidden_layers")
    hidden = _need(cfg, "hidden_size")
    heads = _need(cfg, "num_attention_heads")
    kw: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "ffn_hidden_size": _need(cfg, "intermediate_size"),
        "num_attention_heads": heads,
        "num_query_groups": int(cfg.get("num_key_value_heads") or heads),
        "kv_channels": int(cfg.get("head_dim") or hidden // heads),
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(cfg.get("rms_norm_eps", 1e-6)),
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": bool(cfg.get("attention_bias", False)),
        "qk_layernorm": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "mtp_num_layers": _mtp_count(hf_config),
        "use_cpu_initialization": True,
        **_dtype_kwargs(cfg),
    }
    kw.update(LAYOUT_KWARGS[family_key](cfg, num_layers))
    return kw


def _glm4_moe(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {
        "qk_layernorm": bool(cfg.get("use_qk_norm", False)),
        **_deepseek_style_moe(cfg, num_layers),
    }


def _mimo(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {"add_qkv_bias": True}


def _deepseek_v3(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {**_mla_kwargs(cfg), **_deepseek_style_moe(cfg, num_layers)}


def _glm_moe_dsa(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {
        **_deepseek_v3(cfg, num_layers),
        "transformer_impl": "transformer_engine",
        "experimental_attention_variant": "dsa",
        "dsa_indexer_n_heads": _need(cfg, "index_n_heads"),
        "dsa_indexer_head_dim": _need(cfg, "index_head_dim"),
        "dsa_indexer_topk": _need(cfg, "index_topk"),
    }


def shares_indexer(hf_config: Mapping[str, Any], layer: int) -> bool:
    """Whether DSA decoder layer ``layer`` reuses an earlier layer's top-k and holds no indexer
    of its own (GLM-5.2's ``indexer_types`` entry ``shared``; megatron-core >= 0.19 builds no
    indexer there either, its ``dsa_indexer_topk_freq`` layers)."""
    kinds = _text_config(hf_config).get("indexer_types")
    return isinstance(kinds, list) and layer < len(kinds) and kinds[layer] == "shared"


def _qwen3_next(cfg: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    return {
        "transformer_impl": "transformer_engine",
        "qk_layernorm": True,
        "attention_output_gate": True,
        "layernorm_zero_centered_gamma": True,
        "experimental_attention_variant": "gated_delta_net",
        "linear_attention_freq": [
            1 if t == "linear_attention" else 0
            for t in cfg.get("layer_types") or ["full_attention"] * num_layers
        ],
        "linear_conv_kernel_dim": _need(cfg, "linear_conv_kernel_dim"),
        "linear_key_head_dim": _need(cfg, "linear_key_head_dim"),
        "linear_value_head_dim": _need(cfg, "linear_value_head_dim"),
        "linear_num_key_heads": _need(cfg, "linear_num_key_heads"),
        "linear_num_value_heads": _need(cfg, "linear_num_value_heads"),
        **_qwen3_next_moe(cfg, num_layers),
    }


LAYOUT_KWARGS: Mapping[str, Callable[[Mapping[str, Any], int], dict[str, Any]]] = {
    "glm4_moe": _glm4_moe,
    "mimo": _mimo,
    "deepseek_v3": _deepseek_v3,
    "glm_moe_dsa": _glm_moe_dsa,
    "qwen3_next": _qwen3_next,
}
"""What each writer layout adds to the common ``TransformerConfig`` kwargs (the code half of
a family's :class:`~mtpcheck.families.interface.MegatronWriter`; a test checks that every
layout a family record names has one)."""


def _mla_kwargs(cfg: Mapping[str, Any]) -> dict[str, Any]:
    # transformers 5 writes ``rope_parameters``; older configs ``rope_scaling``
    scaling = {**(cfg.get("rope_parameters") or {}), **(cfg.get("rope_scaling") or {})}
    kw: dict[str, Any] = {
        "multi_latent_attention": True,
        "q_lora_rank": _need(cfg, "q_lora_rank") if cfg.get("q_lora_rank") else None,
        "kv_lora_rank": _need(cfg, "kv_lora_rank"),
        "qk_head_dim": _need(cfg, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": _need(cfg, "qk_rope_head_dim"),
        "v_head_dim": _need(cfg, "v_head_dim"),
        "qk_layernorm": True,
        "rotary_base": float(_rope_theta(cfg)),
        "rope_type": "yarn" if scaling.get("rope_type", scaling.get("type")) == "yarn" else "rope",
    }
    if kw["rope_type"] == "yarn":
        kw.update(
            {
                "rotary_scaling_factor": float(scaling.get("factor", 1.0)),
                "original_max_position_embeddings": int(
                    scaling.get("original_max_position_embeddings", 4096)
                ),
                "beta_fast": float(scaling.get("beta_fast", 32)),
                "beta_slow": float(scaling.get("beta_slow", 1)),
                "mscale": float(scaling.get("mscale", 1.0)),
                "mscale_all_dim": float(scaling.get("mscale_all_dim", 0.0)),
            }
        )
    return kw


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _partial_rotary(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))


def transformer_config_class(transformer_kwargs: Mapping[str, Any]) -> type:
    """``MLATransformerConfig`` for MLA kwargs, else ``TransformerConfig`` (imports megatron)."""
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    multi_latent = transformer_kwargs.get("multi_latent_attention")
    chosen: type = MLATransformerConfig if multi_latent else TransformerConfig  # untyped module
    return chosen


def gpt_model_kwargs(hf_config: Mapping[str, Any], family_key: str) -> dict[str, Any]:
    """``GPTModel`` constructor arguments besides config and specs."""
    family_info(family_key)
    cfg = _text_config(hf_config)
    return {
        "vocab_size": _need(cfg, "vocab_size"),
        "max_sequence_length": int(cfg.get("max_position_embeddings", 4096)),
        "position_embedding_type": "rope",
        "rotary_percent": _partial_rotary(cfg),
        "rotary_base": int(_rope_theta(cfg)),
        "share_embeddings_and_output_weights": bool(cfg.get("tie_word_embeddings", False)),
    }


_ARG_NAMES = {
    # TransformerConfig field -> Megatron-LM argument name, where they differ.
    "layernorm_epsilon": "norm_epsilon",
    "num_moe_experts": "num_experts",
    "gated_linear_unit": "swiglu",
}


def args_namespace(
    hf_config: Mapping[str, Any],
    family_key: str,
    *,
    padded_vocab_size: int | None = None,
    **overrides: Any,
) -> argparse.Namespace:
    """The Megatron-LM ``args`` a torch_dist checkpoint of this model stores in ``common.pt``.

    Holds the model-shape arguments under Megatron-LM's names (``num_layers``, ``hidden_size``,
    ``num_experts``, ``mtp_num_layers``, ``swiglu``, ...), single-rank parallel sizes and
    ``ckpt_format="torch_dist"``. ``padded_vocab_size`` is the number of embedding rows
    (default: the HF ``vocab_size``); ``make_vocab_size_divisible_by`` is chosen so that
    Megatron-LM's padding of ``vocab_size`` reproduces it when they are equal. Only picklable
    plain values are stored (no activation function).
    """
    kw = transformer_config_kwargs(hf_config, family_key)
    model = gpt_model_kwargs(hf_config, family_key)
    vocab = model["vocab_size"]
    padded = vocab if padded_vocab_size is None else int(padded_vocab_size)
    values: dict[str, Any] = {}
    for name, value in kw.items():
        if callable(value):
            continue
        values[_ARG_NAMES.get(name, name)] = list(value) if isinstance(value, list) else value
    values.update(
        {
            "group_query_attention": kw["num_query_groups"] != kw["num_attention_heads"],
            "max_position_embeddings": model["max_sequence_length"],
            "position_embedding_type": model["position_embedding_type"],
            # rope only: Megatron-LM compares this flag on load (default True when absent)
            "add_position_embedding": False,
            "tokenizer_type": "HuggingFaceTokenizer",
            "rotary_percent": model["rotary_percent"],
            "rotary_base": model["rotary_base"],
            "untie_embeddings_and_output_weights": not model["share_embeddings_and_output_weights"],
            "vocab_size": vocab,
            "padded_vocab_size": padded,
            "make_vocab_size_divisible_by": math.gcd(padded, 128),
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "expert_model_parallel_size": 1,
            "expert_tensor_parallel_size": 1,
            "context_parallel_size": 1,
            "transformer_impl": kw.get("transformer_impl", "local"),
            "ckpt_format": "torch_dist",
            "model_family": family_key,
        }
    )
    values.update(overrides)
    return argparse.Namespace(**values)


def uses_stacked_layers(transformer_kwargs: Mapping[str, Any]) -> bool:
    """Whether torch_dist stacks decoder layers under one key with a leading layer axis.

    Mirrors ``TransformerBlock.sharded_state_dict`` (megatron-core 0.16.1) with the default
    Megatron-LM metadata (``singleton_local_shards=False``): a list or an int > 1 in
    ``moe_layer_freq`` or ``linear_attention_freq``, or heterogeneous block specs give
    per-layer keys ``decoder.layers.{k}.…``.
    """

    def irregular(value: Any) -> bool:
        return isinstance(value, list) or (isinstance(value, int) and value > 1)

    return not (
        irregular(transformer_kwargs.get("moe_layer_freq", 1))
        or irregular(transformer_kwargs.get("linear_attention_freq"))
        or transformer_kwargs.get("heterogeneous_block_specs", False)
        or transformer_kwargs.get("hetereogenous_dist_checkpoint", False)
    )


def torch_dist_layout(transformer_kwargs: Mapping[str, Any]) -> Layout:
    """The torch_dist key layout of a model of these ``TransformerConfig`` kwargs (one rank).

    Known for local-spec models and for the Transformer Engine variants of
    :data:`TE_VARIANTS`; other Transformer Engine models raise NotImplementedError, since TE
    modules carry their own extra state, which cannot be reproduced (or checked) without it.
    """
    kw = transformer_kwargs
    impl = kw.get("transformer_impl", "local")
    variant = kw.get("experimental_attention_variant")
    te = impl == "transformer_engine" and variant in TE_VARIANTS
    if impl != "local" and not te:
        raise NotImplementedError(
            f"only local-spec models and the {' / '.join(TE_VARIANTS)} variants can be "
            f"written, not transformer_impl={impl!r}"
        )
    if te:
        norms = NormSpec.TE_GATED_DELTA_NET if variant == "gated_delta_net" else NormSpec.TE_DSA
    else:
        norms = NormSpec.UNFUSED if kw.get("multi_latent_attention") else NormSpec.LOCAL
    row_parts: dict[str, RowParts] = {}
    if variant == "gated_delta_net":
        v_heads = int(kw["linear_num_value_heads"])
        row_parts = gated_delta_net_row_parts(
            qk_rows=int(kw["linear_key_head_dim"]) * int(kw["linear_num_key_heads"]),
            v_rows=int(kw["linear_value_head_dim"]) * v_heads,
            v_heads=v_heads,
        )
    moe = layer_pattern(kw, "moe_layer_freq") if kw.get("num_moe_experts") else []
    return Layout(
        num_layers=int(kw["num_layers"]),
        num_experts=int(kw.get("num_moe_experts") or 0),
        stacked=uses_stacked_layers(kw),
        glu=bool(kw.get("gated_linear_unit", False)),
        norms=norms,
        linear_layers=frozenset(
            k for k, v in enumerate(layer_pattern(kw, "linear_attention_freq")) if v
        ),
        moe_layers=frozenset(k for k, v in enumerate(moe) if v),
        row_parts=row_parts,
    )


# --- which layers are which --------------------------------------------------------------


def layer_pattern(kw: Mapping[str, Any], name: str) -> list[int]:
    """Per decoder layer, 1 where ``name`` (a layer-frequency setting) selects the layer."""
    value = kw.get(name)
    n = int(kw["num_layers"])
    if value is None:
        return [0] * n
    if isinstance(value, int):
        if name == "moe_layer_freq":
            return [1 if k % value == 0 else 0 for k in range(n)]
        return [0 if (k + 1) % value == 0 else 1 for k in range(n)]
    return [int(v) for v in value]
