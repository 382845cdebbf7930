"""The MTP family registry: one entry per family, as data.

Facts and their sources are collected in docs/families.md (its tables are built from here); the
families released in 2025-2026 are in :mod:`mtpcheck.families.catalog_2026`, each with its
sources.
"""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families.catalog_2026 import FAMILIES_2026, qwen_style
from mtpcheck.families.interface import (
    MEASURABLE,
    MEGATRON_BRIDGE,
    AcceptSupport,
    ChainHidden,
    ConcatOrder,
    CopyPolicy,
    HfLayout,
    MegatronMapping,
    MegatronWriter,
    MtpCount,
    MtpFamily,
    OtherConverter,
    Serving,
    SharedCopy,
    Support,
)
from mtpcheck.families.module_parts import EH_PARTS, megatron_module, under
from mtpcheck.families.serving import DEEPSEEK_ROUTER, SHARED_HEAD

_DEEPSEEK_SPECIFIC = under("model.layers.{n}.", (*EH_PARTS, "shared_head.norm.weight"))
_DEEPSEEK_MAPPING = MegatronMapping()
_DEEPSEEK_WRITER = MegatronWriter(
    "deepseek_v3",
    "local",
    False,
    "MLA: without Transformer Engine MultiLatentAttention's isinstance check against the "
    "TELinear stub raises, and the local DotProductAttention rejects k_channels",
)
_DEEPSEEK_COPIES = (
    SharedCopy("model.layers.{n}.embed_tokens.weight", "model.embed_tokens.weight"),
    SharedCopy("model.layers.{n}.shared_head.head.weight", "lm_head.weight"),
)
_DEEPSEEK_LAYOUT = HfLayout(
    layer_prefix="model.layers.{n}.",
    specific=_DEEPSEEK_SPECIFIC,
    projection="model.layers.{n}.eh_proj.weight",
    copies=_DEEPSEEK_COPIES,
    head_parts=_DEEPSEEK_SPECIFIC,  # Megatron's enorm, hnorm, eh_proj, final_layernorm
)
_ZEROES = Serving(zeroes_position0=True)
_ROUTED = Serving(zeroes_position0=True, defaults=DEEPSEEK_ROUTER)
_NO_EXTRAS = Support()


def _deepseek_style(
    key: str,
    display: str,
    architectures: tuple[str, ...],
    copy_policy: CopyPolicy,
    serving: Serving = _ZEROES,
    support: Support = _NO_EXTRAS,
    notes: str = "",
) -> MtpFamily:
    """Families that append MTP layers after the decoder as ``model.layers.{N+i}``."""
    return MtpFamily(
        key=key,
        display=display,
        model_types=(key,),
        architectures=architectures,
        layout=replace(_DEEPSEEK_LAYOUT, copy_policy=copy_policy),
        megatron=_DEEPSEEK_MAPPING,
        serving=serving,
        support=support,
        notes=notes,
    )


_MIMO_SPECIFIC = tuple(
    f"model.mtp_layers.{{i}}.{name}.weight"
    for name in ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")
)
"""MiMo's MTP-only tensors, in the order of Megatron's enorm, hnorm, eh_proj, final_layernorm."""

FAMILIES: tuple[MtpFamily, ...] = (
    _deepseek_style(
        "deepseek_v3",
        "DeepSeek-V3 / R1 / V3.1",
        ("DeepseekV3ForCausalLM",),
        CopyPolicy.REQUIRED,
        serving=replace(_ROUTED, stored_copies=SHARED_HEAD),
        support=Support(writer=_DEEPSEEK_WRITER, accept=MEASURABLE),
        notes="embed_tokens and shared_head.head are stored copies of the main tensors",
    ),
    MtpFamily(
        key="deepseek_v32",
        display="DeepSeek-V3.2",
        model_types=("deepseek_v32",),
        architectures=("DeepseekV32ForCausalLM",),
        layout=replace(
            _DEEPSEEK_LAYOUT,
            specific=(*_DEEPSEEK_SPECIFIC, "model.layers.{n}.shared_head.head.weight"),
            copies=(_DEEPSEEK_COPIES[0],),
            copy_policy=CopyPolicy.REQUIRED,
        ),
        megatron=_DEEPSEEK_MAPPING,
        serving=replace(_ROUTED, stored_copies=SHARED_HEAD),
        support=Support(
            no_writer="megatron-core's MTP layer draws through the main output layer and has no "
            "head of its own, while DeepSeek-V3.2's holds shared_head.head as its own tensor, "
            f"which a Megatron checkpoint cannot keep ({MEGATRON_BRIDGE} has no DeepSeek-V3.2 "
            "bridge either)"
        ),
        notes="MTP block carries the sparse-attention indexer; shared_head.head is "
        "reported trained on its own, so only embed_tokens is compared as a copy",
    ),
    _deepseek_style(
        "kimi_k2",
        "Kimi-K2",
        ("DeepseekV3ForCausalLM",),
        CopyPolicy.REQUIRED,
        serving=replace(_ROUTED, stored_copies=SHARED_HEAD),
        support=Support(writer=_DEEPSEEK_WRITER, build_as="deepseek_v3"),
        notes="DeepSeek-V3 architecture; released configs declare 0 MTP layers",
    ),
    _deepseek_style(
        "glm4_moe",
        "GLM-4.5 / 4.6 / 4.7",
        ("Glm4MoeForCausalLM",),
        CopyPolicy.OPTIONAL,
        serving=replace(_ZEROES, stored_copies=SHARED_HEAD),
        support=Support(
            writer=MegatronWriter(
                "glm4_moe", "local", True, "GQA + q/k/v bias + qk-norm, MoE with shared experts"
            ),
            accept=MEASURABLE,
        ),
        notes="GLM-4.5 stores embed/head copies in the MTP layer, GLM-4.6 does not",
    ),
    _deepseek_style(
        "glm4_moe_lite",
        "GLM-4.7-Flash",
        ("Glm4MoeLiteForCausalLM",),
        CopyPolicy.OPTIONAL,
    ),
    _deepseek_style(
        "glm_moe_dsa",
        "GLM-5",
        ("GlmMoeDsaForCausalLM",),
        CopyPolicy.NONE,
        serving=_ROUTED,
        support=Support(
            writer=MegatronWriter(
                "glm_moe_dsa",
                "te",
                False,
                "MLA with the DSA indexer: megatron-core's DSA attention needs Transformer "
                "Engine; the writer writes the layout of megatron-core >= 0.17's experimental "
                "DSA spec (unfused input norm, standalone q/kv norms, indexer under "
                "self_attention.core_attention.indexer) without building the model",
            ),
            accept=AcceptSupport(
                why_not="its DSA layer has no outside reference (transformers' MtpModel cannot "
                "run 'indexed_attention' layers)"
            ),
        ),
        notes="78 hidden + 1 MTP layer; no embed/head copies stored",
    ),
    MtpFamily(
        key="step3p5",
        display="Step-3.5-Flash",
        model_types=("step3p5",),
        architectures=("Step3p5ForCausalLM",),
        count=MtpCount(default=1),
        layout=HfLayout(
            layer_prefix="model.layers.{n}.",
            specific=(
                "model.layers.{n}.enorm.weight",
                "model.layers.{n}.hnorm.weight",
                "model.layers.{n}.eh_proj.weight",
                "model.layers.{n}.transformer.shared_head.norm.weight",
                "model.layers.{n}.transformer.shared_head.output.weight",
            ),
            projection="model.layers.{n}.eh_proj.weight",
            head_output="model.layers.{n}.transformer.shared_head.output.weight",
        ),
        serving=Serving(chain_hidden=ChainHidden.PRE_NORM, first_state=ChainHidden.PRE_NORM),
        support=Support(
            elsewhere=(OtherConverter(MEGATRON_BRIDGE, "Step35Bridge", mtp=True),),
            accept=AcceptSupport(
                why_not="Step-3.5 releases ship remote code only (model_type step3p5 without a "
                "transformers class for the checkpoint's transformer.* names)"
            ),
        ),
        notes="3 dense MTP layers; each shared_head.output is trained on its own, not a copy",
    ),
    qwen_style(
        "qwen3_next",
        "Qwen3-Next",
        ("qwen3_next",),
        ("Qwen3NextForCausalLM",),
        root="model.",
        count=MtpCount(("num_nextn_predict_layers", "mtp_num_hidden_layers"), default=1),
        megatron=MegatronMapping(gated_attention=True, shared_expert_style="shared_expert"),
        writer=MegatronWriter(
            "qwen3_next",
            "te",
            False,
            "gated delta net: the experimental block spec requires Transformer Engine and "
            "GatedDeltaNet requires the fla package; the writer writes the Transformer "
            "Engine layout without building the model (in_proj / conv1d split by rows into "
            "the keys GatedDeltaNet.sharded_state_dict names)",
        ),
        accept=MEASURABLE,
        notes="config.json has no count key; serving engines assume 1 MTP layer",
    ),
    MtpFamily(
        key="mimo",
        display="MiMo-7B",
        model_types=("mimo",),
        architectures=("MiMoForCausalLM",),
        layout=HfLayout(
            layer_prefix="model.mtp_layers.{i}.",
            specific=_MIMO_SPECIFIC,
            projection="model.mtp_layers.{i}.input_proj.weight",
            concat_order=ConcatOrder.HIDDEN_FIRST,
            head_parts=_MIMO_SPECIFIC,
        ),
        megatron=MegatronMapping(),
        serving=_ZEROES,
        support=Support(
            writer=MegatronWriter("mimo", "local", True, "Qwen2-style dense GQA with q/k/v bias"),
            accept=AcceptSupport(
                why_not="transformers has no MiMo class (the checkpoints ship remote code)"
            ),
            build_as="qwen2",
        ),
        notes="input_proj multiplies cat(hidden, embedding): halves swapped against Megatron",
    ),
    MtpFamily(
        key="ernie4_5_moe",
        display="ERNIE-4.5 MoE",
        model_types=("ernie4_5_moe",),
        architectures=("Ernie4_5_MoeForCausalLM",),
        layout=HfLayout(
            layer_prefix="model.mtp_block.{i}.",
            specific=(
                "model.mtp_emb_norm.{i}.weight",
                "model.mtp_hidden_norm.{i}.weight",
                "model.mtp_linear_proj.{i}.weight",
            ),
            projection="model.mtp_linear_proj.{i}.weight",
        ),
    ),
    MtpFamily(
        key="longcat_flash",
        display="LongCat-Flash",
        model_types=("longcat_flash",),
        architectures=("LongcatFlashForCausalLM",),
        count=MtpCount(default=1),
        layout=HfLayout(
            layer_prefix="model.mtp.layers.{i}.",
            specific=(
                "model.mtp.layers.{i}.eh_proj.weight",
                "model.mtp.layers.{i}.enorm.m.weight",
                "model.mtp.layers.{i}.hnorm.m.weight",
                "model.mtp.norm.weight",
                "model.mtp.layers.{i}.input_layernorm.weight",
                "model.mtp.layers.{i}.post_attention_layernorm.weight",
                *(
                    f"model.mtp.layers.{{i}}.self_attn.{name}.weight"
                    for name in (
                        "q_a_proj",
                        "q_b_proj",
                        "kv_a_proj_with_mqa",
                        "kv_b_proj",
                        "o_proj",
                        "q_a_layernorm",
                        "kv_a_layernorm",
                    )
                ),
                *(
                    f"model.mtp.layers.{{i}}.transformer_layer.mlp.{name}_proj.weight"
                    for name in ("gate", "up", "down")
                ),
            ),
            projection="model.mtp.layers.{i}.eh_proj.weight",
            copies=(SharedCopy("model.mtp.embed_tokens.weight", "model.embed_tokens.weight"),),
            copy_policy=CopyPolicy.OPTIONAL,
            inner_mirrors_main=False,
        ),
        notes="the MTP block is a dense layer unlike the main layers, so its tensors are listed",
    ),
)

MEGATRON = MtpFamily(
    key="megatron",
    display="Megatron-Core GPT",
    model_types=("megatron",),
    architectures=(),
    count=MtpCount(("mtp_num_layers",), hidden_layers_key="num_layers", from_command_line=True),
    layout=replace(
        megatron_module("mtp.layers.{i}."),
        main_shared=("embedding.word_embeddings.weight", "output_layer.weight"),
        main_layer_prefix="decoder.layers.{k}.",
        main_norm="decoder.final_layernorm.weight",
    ),
    support=Support(
        accept=AcceptSupport(
            why_not="accept runs HF checkpoints (convert a Megatron one with `mtpcheck convert`)"
        )
    ),
    notes="native Megatron names; embedding and output head are shared with the main model",
)
"""Megatron checkpoints, whatever model they hold, in mtpcheck's canonical names."""

_NEXTN = "blk.{n}.nextn."
GGUF = MtpFamily(
    key="gguf",
    display="GGUF (llama.cpp)",
    model_types=("gguf",),
    architectures=(),
    count=MtpCount(("nextn_predict_layers",)),
    layout=HfLayout(
        layer_prefix="blk.{n}.",
        specific=tuple(
            _NEXTN + name
            for name in (
                "enorm.weight",
                "hnorm.weight",
                "eh_proj.weight",
                "shared_head_norm.weight",
            )
        ),
        projection=_NEXTN + "eh_proj.weight",
        copies=(
            SharedCopy(_NEXTN + "embed_tokens.weight", "token_embd.weight"),
            SharedCopy(_NEXTN + "shared_head_head.weight", "output.weight"),
        ),
        copy_policy=CopyPolicy.OPTIONAL,
        main_shared=("token_embd.weight", "output.weight"),
        main_layer_prefix="blk.{k}.",
        main_norm="output_norm.weight",
    ),
    support=Support(accept=AcceptSupport(why_not="accept runs HF checkpoints")),
    notes="llama.cpp's names (gguf-py MODEL_TENSOR.NEXTN_*): the nextn layer is block "
    "{arch}.block_count - nextn_predict_layers onward, its MTP-only tensors under blk.{n}.nextn.",
)
"""GGUF files as llama.cpp's ``convert_hf_to_gguf.py`` writes them, whatever the model."""

HYBRID_MTP_PATTERN = "mtp_hybrid_override_pattern"
"""Megatron config key of a hybrid (Mamba) model's MTP block pattern, one character a layer."""
MEGATRON_HYBRID = replace(
    MEGATRON,
    key="megatron_hybrid",
    display="Megatron-Core hybrid (Mamba)",
    model_types=(),
    layout=replace(
        MEGATRON.layout,
        layer_prefix="mtp.layers.{d}.transformer_layer.layers.{t}.",
        specific=tuple(t.replace("{i}", "{d}") for t in MEGATRON.layout.specific),
        projection="mtp.layers.{d}.eh_proj.weight",
        flat_layers_keys=((HYBRID_MTP_PATTERN, "hybrid_layer_pattern"),),
    ),
    notes="megatron-core's hybrid stack (Nemotron-H): each MTP depth is a small stack of "
    "layers (the MTP pattern), each mirroring a main layer of its kind; "
    "hybrid_layer_pattern is the main pattern, then '/', then the MTP pattern",
)
"""Megatron checkpoints of megatron-core's hybrid model (``mtp_hybrid_override_pattern`` in
their config), whose MTP block nests ``layers.{t}`` (Megatron-Bridge 0.6 ``nemotron_h``)."""

FAMILIES = (*FAMILIES, *FAMILIES_2026, MEGATRON, MEGATRON_HYBRID, GGUF)

FAMILY_BY_NAME: dict[str, MtpFamily] = {f.key: f for f in FAMILIES}
FAMILY_BY_MODEL_TYPE: dict[str, MtpFamily] = {t: f for f in FAMILIES for t in f.model_types}

GENERIC_COUNT_KEYS = (
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "num_mtp_layers",
    "mtp_num_layers",
    "num_mtp_modules",
    "mtp_config.num_nextn_predict_layers",
)
"""Count keys tried, in order, for a checkpoint of unknown family."""
