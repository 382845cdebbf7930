"""Registry entries of the families whose MTP layers are laid out in names of their own (MiMo,
ERNIE, LongCat, DeepSeek-V4), and of Gemma 4, whose drafter ships apart, as data.

Each entry names where its layout was confirmed: the transformers model and the MTP loader of
a serving engine (vLLM ``vllm/model_executor/models/...`` or SGLang
``python/sglang/srt/models/...``).
"""

from __future__ import annotations

from mtpcheck.families.interface import (
    MEGATRON_BRIDGE,
    AcceptSupport,
    ConcatOrder,
    CopyPolicy,
    Drafter,
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
from mtpcheck.families.module_parts import EH_PARTS, main_model_under, under

_MIMO_SPECIFIC = tuple(
    f"model.mtp_layers.{{i}}.{name}.weight"
    for name in ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")
)
"""MiMo's MTP-only tensors, in the order of Megatron's enorm, hnorm, eh_proj, final_layernorm."""
_NO_MTP_LAYERS = HfLayout(layer_prefix="mtp.layers.{i}.", specific=(), projection="")
"""Gemma 4's: the drafter is a model of its own, not MTP layers inside the checkpoint."""

OWN_LAYOUTS: tuple[MtpFamily, ...] = (
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
        serving=Serving(zeroes_position0=True),
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
    # transformers models/deepseek_v4 (drops r"(^|\.)mtp\..*" on load); vLLM
    # deepseek_v4_mtp.py, SGLang deepseek_v4_nextn.py. Names as released (no "model."
    # prefix); e_proj and h_proj replace eh_proj; the MTP block has sliding-window attention
    # only (no compressor or indexer). emb.tok_emb / head: copies in the Base release only.
    MtpFamily(
        key="deepseek_v4",
        display="DeepSeek-V4",
        model_types=("deepseek_v4",),
        architectures=("DeepseekV4ForCausalLM",),
        layout=main_model_under(
            HfLayout(
                layer_prefix="mtp.{i}.",
                specific=under(
                    "mtp.{i}.",
                    (
                        "enorm.weight",
                        "hnorm.weight",
                        "e_proj.weight",
                        "h_proj.weight",
                        "norm.weight",
                        "hc_head_fn",
                        "hc_head_base",
                        "hc_head_scale",
                    ),
                ),
                projection="mtp.{i}.e_proj.weight",
                concat_order=ConcatOrder.SPLIT,
                copies=(
                    SharedCopy("mtp.{i}.emb.tok_emb.weight", "embed.weight"),
                    SharedCopy("mtp.{i}.head.weight", "head.weight"),
                ),
                copy_policy=CopyPolicy.OPTIONAL,
                block_lacks=("attn.compressor.", "attn.indexer."),
            ),
            "",  # no root: the release's main names carry no prefix
            embed="embed.weight",
            head="head.weight",
        ),
        support=Support(
            elsewhere=(OtherConverter(MEGATRON_BRIDGE, "DeepSeekV4Bridge", mtp=True),),
            accept=AcceptSupport(
                why_not="split e_proj/h_proj projections over hyper-connection streams are "
                "not built yet"
            ),
        ),
        notes="e_proj(embedding) + h_proj(hidden); the Base release stores embed/head copies",
    ),
    # transformers models/mimo_v2_flash (ignores r"^model\.mtp\."); vLLM mimo_v2_flash_mtp.py.
    # No count key: vLLM maps the 3 layers released checkpoints hold onto one shared MTP layer
    # (the last one loaded wins) and runs it at every draft step, its final_layernorm inside
    # the layer (a post-norm chain). The block has SWA attention and a dense MLP with its own
    # norm names, so its tensors are listed.
    MtpFamily(
        key="mimo_v2_flash",
        display="MiMo-V2-Flash",
        model_types=("mimo_v2_flash",),
        architectures=("MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM"),
        count=MtpCount(default=3),
        layout=HfLayout(
            layer_prefix="model.mtp.layers.{i}.",
            specific=under(
                "model.mtp.layers.{i}.",
                (
                    *EH_PARTS,
                    "input_layernorm.weight",
                    "self_attn.q_proj.weight",
                    "self_attn.k_proj.weight",
                    "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight",
                    "pre_mlp_layernorm.weight",
                    "mlp.gate_proj.weight",
                    "mlp.up_proj.weight",
                    "mlp.down_proj.weight",
                    "final_layernorm.weight",
                ),
            ),
            projection="model.mtp.layers.{i}.eh_proj.weight",
            inner_mirrors_main=False,
        ),
        support=Support(
            accept=AcceptSupport(
                why_not="its MTP block (sliding-window attention with its own head counts, "
                "pre_mlp_layernorm) is no main decoder layer, and transformers' MtpModel cannot "
                "be built for it (no num_mtp_layers in its config), so there is no outside "
                "reference"
            )
        ),
        notes="no count key; released checkpoints hold 3 MTP layers (vLLM serves one shared "
        "layer from them)",
    ),
    # transformers models/gemma4 and models/gemma4_assistant; vLLM gemma4_mtp.py. Gemma 4's
    # drafter is a repository of its own (<target>-assistant); the main model holds none.
    MtpFamily(
        key="gemma4",
        display="Gemma 4",
        model_types=("gemma4", "gemma4_text", "gemma4_unified"),
        architectures=("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"),
        layout=_NO_MTP_LAYERS,
        drafter=Drafter.SEPARATE,
        support=Support(
            accept=AcceptSupport(
                why_not="its drafter is a separate checkpoint (the -assistant repository)"
            )
        ),
        notes="the drafter ships as a separate <model>-assistant repository",
    ),
    MtpFamily(
        key="gemma4_assistant",
        display="Gemma 4 assistant (drafter)",
        model_types=("gemma4_assistant", "gemma4_unified_assistant"),
        architectures=("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM"),
        layout=_NO_MTP_LAYERS,
        drafter=Drafter.IS_DRAFTER,
        support=Support(
            accept=AcceptSupport(
                why_not="this checkpoint is a drafter for a Gemma 4 model, not a model with MTP "
                "layers"
            )
        ),
        notes="a whole drafter model; its backbone_hidden_size must equal the target's hidden_size",
    ),
)
