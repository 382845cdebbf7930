"""Registry entries for the MTP families released in 2025-2026, as data.

Each entry names where its layout was confirmed: the transformers 5.24 model (config keys,
main-model names as ``save_pretrained`` writes them, the ``_keys_to_ignore_on_load_unexpected``
pattern that drops the MTP tensors on load) and the MTP loader of a serving engine (vLLM
``vllm/model_executor/models/...`` or SGLang ``python/sglang/srt/models/...``), which is what
reads the MTP tensors in practice.
"""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families.interface import (
    MEASURABLE,
    MEGATRON_BRIDGE,
    NOT_MEASURABLE,
    AcceptSupport,
    ChainHidden,
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
from mtpcheck.families.module_parts import EH_PARTS, MODULE_PARTS, megatron_module, under
from mtpcheck.families.serving import NEMOTRON_H_ONE_LAYER

_QWEN_COUNT = MtpCount(("mtp_num_hidden_layers", "num_nextn_predict_layers"), default=1)
_NEXTN_ONE = MtpCount(default=1)
_SERVED_AS_TRAINED = Serving()


def qwen_style(
    key: str,
    display: str,
    model_types: tuple[str, ...],
    architectures: tuple[str, ...],
    root: str,
    count: MtpCount = _QWEN_COUNT,
    megatron: MegatronMapping | None = None,
    accept: AcceptSupport = NOT_MEASURABLE,
    writer: MegatronWriter | None = None,
    notes: str = "",
    no_writer: str = "",
    elsewhere: tuple[OtherConverter, ...] = (),
) -> MtpFamily:
    """Families with Qwen3-Next's top-level ``mtp.`` block: ``mtp.fc`` over
    cat(``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``), then ``mtp.layers.{i}``;
    ``megatron``: the HF <-> Megatron mapping of that block (Megatron-Bridge's), if any."""
    return MtpFamily(
        key=key,
        display=display,
        model_types=model_types,
        architectures=architectures,
        count=count,
        layout=HfLayout(
            layer_prefix="mtp.layers.{i}.",
            specific=("mtp.fc.weight", *QWEN_HEAD_PARTS[:2], "mtp.norm.weight"),
            projection="mtp.fc.weight",
            main_shared=(f"{root}embed_tokens.weight", "lm_head.weight"),
            main_layer_prefix=root + "layers.{k}.",
            main_norm=f"{root}norm.weight",
            head_parts=QWEN_HEAD_PARTS,
        ),
        megatron=megatron,
        support=Support(writer=writer, accept=accept, no_writer=no_writer, elsewhere=elsewhere),
        notes=notes,
    )


QWEN_HEAD_PARTS = (
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.fc.weight",
    "mtp.norm.weight",
)
"""Megatron's enorm, hnorm, eh_proj and final_layernorm of the one MTP layer (Megatron-Bridge
0.6 ``qwen35_bridge.py``: ``mtp.layers.0.{enorm, hnorm, eh_proj, final_layernorm}``)."""
_QWEN_MAPPING = MegatronMapping(
    gated_attention=True, shared_expert_style="shared_expert", gdn_split=True
)
"""Qwen3.5's: gated attention, Qwen's gated shared expert, the four-tensor delta-net input."""


def _appended(
    key: str,
    display: str,
    model_types: tuple[str, ...],
    architectures: tuple[str, ...],
    root: str,
    tail: tuple[str, ...],
    main_shared: tuple[str, str] | None = None,
    copies: tuple[SharedCopy, ...] = (),
    copy_policy: CopyPolicy = CopyPolicy.NONE,
    block_lacks: tuple[str, ...] = (),
    accept: AcceptSupport = NOT_MEASURABLE,
    serving: Serving = _SERVED_AS_TRAINED,
    notes: str = "",
    mapped: bool = False,
    hf_aliases: tuple[tuple[str, str], ...] = (),
) -> MtpFamily:
    """DeepSeek-style families: MTP layer ``i`` appended as decoder layer
    ``num_hidden_layers + i`` under ``root``, with enorm/hnorm/eh_proj and the ``tail``
    tensors of its own around a block that mirrors a main layer; ``mapped``: with the
    HF <-> Megatron mapping whose final_layernorm is the first ``tail`` tensor."""
    prefix = root + "layers.{n}."
    specific = under(prefix, (*EH_PARTS, *tail))
    return MtpFamily(
        key=key,
        display=display,
        model_types=model_types,
        architectures=architectures,
        layout=HfLayout(
            layer_prefix=prefix,
            specific=specific,
            projection=prefix + "eh_proj.weight",
            copies=copies,
            copy_policy=copy_policy,
            main_shared=main_shared or (f"{root}embed_tokens.weight", "lm_head.weight"),
            main_layer_prefix=root + "layers.{k}.",
            main_norm=f"{root}norm.weight",
            block_lacks=block_lacks,
            head_parts=specific[:4] if mapped else None,
        ),
        megatron=MegatronMapping(hf_aliases=hf_aliases) if mapped else None,
        serving=serving,
        support=Support(accept=accept),
        notes=notes,
    )


_HC_SPLIT = AcceptSupport(
    why_not="split projections over hyper-connection streams are not built yet"
)


def _qwen4_exp(key: str, model_type: str, architecture: str, root: str) -> MtpFamily:
    return MtpFamily(
        key=key,
        display="Qwen3.8-Flash-Next (qwen4_exp)",
        model_types=(model_type,),
        architectures=(architecture,),
        count=_QWEN_COUNT,
        layout=HfLayout(
            layer_prefix="mtp.layers.{i}.",
            specific=(
                "mtp.fc_embedding.weight",
                "mtp.fc_hidden.weight",
                "mtp.pre_fc_norm_embedding.weight",
                "mtp.pre_fc_norm_hidden.weight",
                "mtp.hyper_connection_mixer.hc_norm.weight",
                "mtp.hyper_connection_mixer.input_mix_weight_down.weight",
                "mtp.hyper_connection_mixer.input_mix_weight_up.weight",
            ),
            projection="mtp.fc_embedding.weight",
            concat_order=ConcatOrder.SPLIT,
            main_shared=(f"{root}embed_tokens.weight", "lm_head.weight"),
            main_layer_prefix=root + "layers.{k}.",
            main_norm=f"{root}hyper_connection_mixer.hc_norm.weight",  # no final norm of its own
            block_lacks=("ple.",),
        ),
        support=Support(accept=_HC_SPLIT),
        notes="main layers with per-layer embeddings (ple.*) have them; the MTP block does not",
    )


_STEP3P7 = _appended(
    "step3p7",
    "Step-3.7",
    ("step3p7",),
    ("Step3p7ForConditionalGeneration",),
    root="model.",
    tail=("shared_head.norm.weight", "shared_head.head.weight"),
    notes="3 MTP layers with sliding attention and a dense MLP, each with its own head",
)
"""Step-3.7 as appended layers; its entry adds each layer's own head and how it is served."""
_MTP_MODULES = MtpCount(("num_mtp_modules",))


def _minimax(
    key: str, display: str, model_type: str, architecture: str, root: str, notes: str = ""
) -> MtpFamily:
    """MiniMax's MTP modules: megatron-core's layout (as MiniMax-M3 publishes it), every name
    under ``root`` (the vision-language checkpoint's ``language_model.``)."""
    return MtpFamily(
        key=key,
        display=display,
        model_types=(model_type,),
        architectures=(architecture,),
        count=_MTP_MODULES,
        layout=replace(
            megatron_module(root + "model.mtp.layers.{i}."),
            main_shared=(f"{root}model.embed_tokens.weight", f"{root}lm_head.weight"),
            main_layer_prefix=root + "model.layers.{k}.",
            main_norm=f"{root}model.norm.weight",
        ),
        notes=notes,
    )


_NEMOTRON_H_SPECIFIC = (
    "mtp.layers.{first}.enorm.weight",
    "mtp.layers.{first}.hnorm.weight",
    "mtp.layers.{first}.eh_proj.weight",
    "mtp.layers.{last}.final_layernorm.weight",
)
"""Nemotron-H's MTP-only tensors: Megatron's enorm, hnorm, eh_proj, final_layernorm."""
_NO_MTP_LAYERS = HfLayout(layer_prefix="mtp.layers.{i}.", specific=(), projection="")
"""Gemma 4's: the drafter is a model of its own, not MTP layers inside the checkpoint."""

FAMILIES_2026: tuple[MtpFamily, ...] = (
    # transformers models/qwen3_5{,_moe}; vLLM qwen3_5_mtp.py (Qwen3_5MTP, Qwen3_5MoeMTP),
    # SGLang qwen3_5_mtp.py. Count in text_config; vLLM assumes 1 when absent.
    qwen_style(
        "qwen3_5",
        "Qwen3.5 / 3.6 (VLM)",
        ("qwen3_5", "qwen3_5_moe"),
        ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
        root="model.language_model.",
        megatron=_QWEN_MAPPING,
        accept=MEASURABLE,
        no_writer="it writes the language model of Qwen3.5 (the text-only qwen3_5_text "
        "checkpoint), not a vision-language checkpoint with its vision tower",
        elsewhere=(
            OtherConverter(MEGATRON_BRIDGE, "Qwen35VLBridge / Qwen35VLMoEBridge", mtp=True),
        ),
        notes="MTP block is a full-attention layer; MoE releases pack experts in one of main "
        "and MTP and not the other, either way round",
    ),
    qwen_style(
        "qwen3_5_text",
        "Qwen3.5 / 3.6 (text-only)",
        ("qwen3_5_text", "qwen3_5_moe_text"),
        ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"),
        root="model.",
        megatron=_QWEN_MAPPING,
        accept=MEASURABLE,
        writer=MegatronWriter(
            "qwen3_next",
            "te",
            False,
            "Qwen3-Next's megatron-core layout (gated delta net, gated attention, zero-centred "
            "norms), which Megatron-Bridge 0.6's Qwen3.5 bridge writes too; the writer writes "
            "the Transformer Engine layout without building the model",
        ),
    ),
    # transformers models/exaone_moe; vLLM exaone_moe_mtp.py, SGLang exaone_moe_mtp.py.
    # The MTP block has a dense MLP (it mirrors main layer 0, not the MoE layers).
    qwen_style(
        "exaone_moe",
        "K-EXAONE (EXAONE MoE)",
        ("exaone_moe",),
        ("ExaoneMoeForCausalLM", "ExaoneMoEForCausalLM"),
        root="model.",
        count=_NEXTN_ONE,
        # Megatron-Bridge 0.6 exaone_moe_bridge.py: the bias sits beside the gate
        megatron=MegatronMapping(
            hf_aliases=(("mlp.gate.e_score_correction_bias", "mlp.e_score_correction_bias"),),
        ),
    ),
    # transformers models/exaone4_5 (text model exaone4, post-norm layers);
    # vLLM exaone4_5_mtp.py reads the count from the top-level config, default 1.
    qwen_style(
        "exaone4_5",
        "EXAONE 4.5 (VLM)",
        ("exaone4_5",),
        ("Exaone4_5_ForConditionalGeneration",),
        root="model.language_model.",
        count=_NEXTN_ONE,
    ),
    # transformers models/qwen4_exp; SGLang qwen4_exp_mtp.py. No concat: the embedding and
    # each hyper-connection stream of the hidden state are projected apart and summed.
    *(
        _qwen4_exp(key, model_type, arch, root)
        for key, model_type, arch, root in (
            ("qwen4_exp", "qwen4_exp", "Qwen4ExpForConditionalGeneration", "model.language_model."),
            ("qwen4_exp_text", "qwen4_exp_text", "Qwen4ExpForCausalLM", "model."),
        )
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
        layout=HfLayout(
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
            main_shared=("embed.weight", "head.weight"),
            main_layer_prefix="layers.{k}.",
            main_norm="norm.weight",
            block_lacks=("attn.compressor.", "attn.indexer."),
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
    # Kimi-K3: SGLang kimi_k3.py, TokenSpeed kimi_k3_nextn.py; no transformers class (its text
    # model is kimi_linear). One DeepSeek-shaped layer after the KDA/MLA decoder.
    _appended(
        "kimi_k3",
        "Kimi-K3",
        ("kimi_k3",),
        ("KimiK3ForConditionalGeneration",),
        root="language_model.model.",
        tail=("shared_head.norm.weight",),
        main_shared=("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"),
        copies=(
            SharedCopy(
                "language_model.model.layers.{n}.embed_tokens.weight",
                "language_model.model.embed_tokens.weight",
            ),
            SharedCopy(
                "language_model.model.layers.{n}.shared_head.head.weight",
                "language_model.lm_head.weight",
            ),
        ),
        copy_policy=CopyPolicy.OPTIONAL,
    ),
    # transformers models/glm5_next (ignores r"layers\.45\." on load); SGLang glm5_next_nextn.py.
    # The MTP layer mirrors a DSA + MoE layer without the hyper-connection (hc_*) tensors.
    _appended(
        "glm5_next",
        "GLM-5.3-Flash",
        ("glm5_next",),
        ("Glm5NextForConditionalGeneration",),
        root="model.language_model.",
        tail=("shared_head.norm.weight",),
        main_shared=("model.language_model.embed_tokens.weight", "lm_head.weight"),
        block_lacks=("hc_",),
    ),
    # openPangu: vLLM openpangu_mtp.py (DeepSeek's MTP layer); remote code, no transformers class.
    _appended(
        "pangu_ultra_moe",
        "openPangu Ultra MoE",
        ("pangu_ultra_moe",),
        ("PanguUltraMoEForCausalLM",),
        root="model.",
        tail=("shared_head.norm.weight",),
        copies=(
            SharedCopy("model.layers.{n}.embed_tokens.weight", "model.embed_tokens.weight"),
            SharedCopy("model.layers.{n}.shared_head.head.weight", "lm_head.weight"),
        ),
        copy_policy=CopyPolicy.OPTIONAL,
    ),
    # transformers models/hy_v3 (ignores r"model\.layers\.80.*"); vLLM hy_v3_mtp.py, SGLang
    # hunyuan_v3_nextn.py ("released checkpoints store the draft head's output norm as
    # model.layers.<N>.final_layernorm.weight"). Stored embed/head copies are skipped by vLLM.
    _appended(
        "hy_v3",
        "Hunyuan HY-V3",
        ("hy_v3",),
        ("HYV3ForCausalLM",),
        root="model.",
        tail=("final_layernorm.weight",),
        mapped=True,
        # Megatron-Bridge 0.6 hy_v3_bridge.py: router.gate -> router, shared_mlp ->
        # shared_experts, expert_bias -> router.expert_bias
        hf_aliases=(
            ("mlp.gate.e_score_correction_bias", "mlp.expert_bias"),
            ("mlp.gate.", "mlp.router.gate."),
            ("mlp.shared_experts.", "mlp.shared_mlp."),
        ),
    ),
    # transformers models/hy_v4 (ignores r"model\.mtp_layers\..*"); vLLM hy_v4 mtp.py. The MTP
    # block carries no hyper-connection (hc_pre.*) weights.
    MtpFamily(
        key="hy_v4",
        display="Hunyuan HY-V4",
        model_types=("hy_v4",),
        architectures=("HYV4ForCausalLM",),
        layout=HfLayout(
            layer_prefix="model.mtp_layers.{i}.",
            specific=under("model.mtp_layers.{i}.", MODULE_PARTS),
            projection="model.mtp_layers.{i}.eh_proj.weight",
            block_lacks=("hc_pre.",),
        ),
    ),
    # transformers models/bailing_hybrid (bailing_moe_v2 is remote code); SGLang
    # bailing_moe_nextn.py. Embedding is model.word_embeddings.
    _appended(
        "bailing",
        "Ling / Ring 2.x (Bailing)",
        ("bailing_hybrid", "bailing_moe_v2", "bailing_moe"),
        ("BailingHybridForCausalLM", "BailingMoeV2ForCausalLM"),
        root="model.",
        tail=("final_layernorm.weight",),
        main_shared=("model.word_embeddings.weight", "lm_head.weight"),
        serving=Serving(zeroes_position0=True),
        accept=AcceptSupport(
            why_not="its MTP block keeps the release's tensor names (attention.dense, "
            "kv_a_proj_with_mqa, ...), which transformers renames while loading; accept maps "
            "names one to one and does not apply those renames yet"
        ),
        notes="some remote code counts the MTP layer inside num_hidden_layers; the layer is "
        "found where its eh_proj is",
    ),
    # transformers models/sarvam_moe: a config only; Glm4MoeForCausalLM runs it and saves the
    # release's Bailing-style names (conversion_mapping.py "sarvam_moe": model.word_embeddings,
    # attention.query_key_value). GLM's MTP layer at model.layers.{N}, its block in those names;
    # MtpModel (generate(use_mtp=True)) loads it once the ignore pattern names layer N (Glm4Moe's
    # names GLM's 46 and 92 only). vLLM sarvam.py serves the main model; its registry has no
    # Sarvam MTP model, and no SGLang loader was found.
    _appended(
        "sarvam_moe",
        "Sarvam-MoE",
        ("sarvam_moe",),
        ("SarvamMoEForCausalLM",),
        root="model.",
        tail=("shared_head.norm.weight",),
        main_shared=("model.word_embeddings.weight", "lm_head.weight"),
        accept=AcceptSupport(
            why_not="its MTP block keeps the release's tensor names (attention.query_key_value, "
            "...), which transformers renames while loading; accept does not apply those yet"
        ),
        notes="released checkpoints hold no MTP weights (transformers' config says so)",
    ),
    # transformers models/step3p7 (builds its ignore pattern from the count and loads the layers
    # in MtpModel for generate(use_mtp=True)); vLLM step3p5_mtp.py. Step-3.5's own entry keeps
    # its transformer.shared_head.{norm,output} names; transformers' MtpModel reads these.
    # Serving (vLLM step3p5_mtp.py + v1/spec_decode/step3p5.py): depth d runs layer N+d, its
    # logits come from that layer's own shared_head.{norm,head}, and the block output before
    # shared_head.norm is chained to depth d+1 (transformers' MtpModel instead chains the
    # normed output and uses the main lm_head).
    replace(
        _STEP3P7,
        layout=replace(
            _STEP3P7.layout,
            head_parts=_STEP3P7.layout.specific[:4],
            head_output="model.layers.{n}.shared_head.head.weight",
        ),
        serving=Serving(chain_hidden=ChainHidden.PRE_NORM, first_state=ChainHidden.PRE_NORM),
        support=Support(accept=MEASURABLE),
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
    # transformers models/minimax_m3_vl (ignores r"(^|\.)mtp\..*"); vLLM minimax_m3 mtp.py:
    # enorm/hnorm/eh_proj/final_layernorm around a sparse-attention + MoE transformer_layer.
    _minimax(
        "minimax_m3",
        "MiniMax-M3",
        "minimax_m3_vl",
        "MiniMaxM3SparseForConditionalGeneration",
        root="language_model.",
    ),
    # MiniMax-M2 / M2.5 / M2.7 configs advertise use_mtp and num_mtp_modules: 3, but no
    # release ships MTP weights (MiniMax-M2.7 issue #16); no engine has an MTP loader. The
    # layout is MiniMax-M3's, the only one published. MiniMaxM2Bridge: "MTP modules are not mapped".
    replace(
        _minimax("minimax_m2", "MiniMax-M2", "minimax_m2", "MiniMaxM2ForCausalLM", root=""),
        support=Support(elsewhere=(OtherConverter(MEGATRON_BRIDGE, "MiniMaxM2Bridge", False),)),
        notes="configs advertise 3 MTP modules; released weights hold none",
    ),
    # transformers models/nemotron_h (ignores r"mtp.*"); vLLM nemotron_h_mtp.py, SGLang
    # nemotron_h_mtp.py, Megatron-Bridge nemotron_h_bridge.py: depth d spans the flat layers
    # mtp.layers.{d*L .. d*L+L-1}, L = len(mtp_hybrid_override_pattern); each mirrors a main
    # layer of its pattern character; enorm/hnorm/eh_proj on the first, final_layernorm on the
    # last.
    MtpFamily(
        key="nemotron_h",
        display="Nemotron-H / Nemotron 3",
        model_types=("nemotron_h",),
        architectures=("NemotronHForCausalLM",),
        layout=HfLayout(
            layer_prefix="mtp.layers.{i}.",
            specific=_NEMOTRON_H_SPECIFIC,
            projection="mtp.layers.{first}.eh_proj.weight",
            main_shared=("backbone.embeddings.weight", "lm_head.weight"),
            main_layer_prefix="backbone.layers.{k}.",
            main_norm="backbone.norm_f.weight",
            flat_layers_keys=(
                ("mtp_hybrid_override_pattern", "hybrid_override_pattern"),
                ("mtp_layers_block_type", "layers_block_type"),
            ),
            head_parts=_NEMOTRON_H_SPECIFIC,
        ),
        megatron=MegatronMapping(hybrid_layers=True),
        serving=Serving(limits=NEMOTRON_H_ONE_LAYER),
        support=Support(
            no_writer="megatron-core holds it as its hybrid (Mamba) model, and the built-in "
            "writer writes GPTModel layouts only",
            elsewhere=(OtherConverter(MEGATRON_BRIDGE, "NemotronHBridge", mtp=True),),
            accept=AcceptSupport(
                why_not="transformers cannot run speculative decoding on its stateful Mamba "
                "layers, and the head is not built yet"
            ),
        ),
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
