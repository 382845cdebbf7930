"""Registry entries of the DeepSeek-style families, as data: MTP layer ``i`` appended after the
decoder as layer ``num_hidden_layers + i`` (``model.layers.{n}.``), its ``enorm`` / ``hnorm`` /
``eh_proj`` and a tail of its own around a block that mirrors a main decoder layer.

Each entry names where its layout was confirmed: the transformers model (config keys,
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
    AcceptSupport,
    ChainHidden,
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
from mtpcheck.families.module_parts import EH_PARTS, main_model_under, under
from mtpcheck.families.serving import DEEPSEEK_ROUTER, SHARED_HEAD

_SHARED_HEAD_NORM = ("shared_head.norm.weight",)
"""DeepSeek's own tail: the norm before the (shared) output head."""
_COPIED = ("embed_tokens.weight", "shared_head.head.weight")
"""Names, under the MTP layer, of its stored copies of the main embedding and output head."""
_DECLARED = MtpCount()
_SERVED_AS_TRAINED = Serving()
_NO_EXTRAS = Support()


def deepseek_style(
    key: str,
    display: str,
    architectures: tuple[str, ...],
    *,
    model_types: tuple[str, ...] = (),
    root: str = "model.",
    tail: tuple[str, ...] = _SHARED_HEAD_NORM,
    embed: str = "embed_tokens.weight",
    head: str = "lm_head.weight",
    copy_policy: CopyPolicy | None = None,
    own_head: str = "",
    head_parts: bool | None = None,
    block_lacks: tuple[str, ...] = (),
    megatron: MegatronMapping | None = None,
    count: MtpCount = _DECLARED,
    serving: Serving = _SERVED_AS_TRAINED,
    support: Support = _NO_EXTRAS,
    notes: str = "",
) -> MtpFamily:
    """A DeepSeek-style family: MTP layer ``i`` appended as decoder layer
    ``num_hidden_layers + i`` under ``root`` (``root + "layers.{n}."``), holding enorm / hnorm
    / eh_proj and the ``tail`` tensors of its own (under the layer's prefix) around a block
    that mirrors a main layer.

    ``model_types``: ``(key,)`` unless given. ``embed`` (under ``root``) and ``head`` (whole)
    name the main embedding and output head. ``copy_policy``: None where the layers list no
    copies; else the layer's ``embed_tokens`` and ``shared_head.head`` copies of them (those
    ``tail`` does not hold as tensors of its own) under that policy. ``own_head``: the tail
    tensor that is each layer's output head of its own (Step). ``head_parts``: whether the
    first four MTP-only tensors are Megatron's enorm, hnorm, eh_proj and final_layernorm (by
    default, where the family has a ``megatron`` mapping)."""
    prefix = root + "layers.{n}."
    specific = under(prefix, (*EH_PARTS, *tail))
    layout = main_model_under(
        HfLayout(layer_prefix=prefix, specific=specific, projection=prefix + "eh_proj.weight"),
        root,
        embed=embed,
        head=head,
    )
    copies = tuple(
        SharedCopy(prefix + own, main)
        for own, main in zip(_COPIED, layout.main_shared, strict=True)
        if copy_policy is not None and own not in tail
    )
    with_head_parts = megatron is not None if head_parts is None else head_parts
    return MtpFamily(
        key=key,
        display=display,
        model_types=model_types or (key,),
        architectures=architectures,
        count=count,
        layout=replace(
            layout,
            copies=copies,
            copy_policy=CopyPolicy.NONE if copy_policy is None else copy_policy,
            block_lacks=block_lacks,
            head_parts=specific[:4] if with_head_parts else None,
            head_output=prefix + own_head if own_head else None,
        ),
        megatron=megatron,
        serving=serving,
        support=support,
        notes=notes,
    )


_DEEPSEEK_MAPPING = MegatronMapping()
_DEEPSEEK_WRITER = MegatronWriter(
    "deepseek_v3",
    "local",
    False,
    "MLA: without Transformer Engine MultiLatentAttention's isinstance check against the "
    "TELinear stub raises, and the local DotProductAttention rejects k_channels",
)
_ZEROES = Serving(zeroes_position0=True)
_ROUTED = Serving(zeroes_position0=True, defaults=DEEPSEEK_ROUTER)
_PRE_NORM_CHAIN = Serving(chain_hidden=ChainHidden.PRE_NORM, first_state=ChainHidden.PRE_NORM)
"""Step's engines: the block output before its own head's norm is chained, and depth 1 gets
the main model's state before ``model.norm``."""

DEEPSEEK_STYLE: tuple[MtpFamily, ...] = (
    deepseek_style(
        "deepseek_v3",
        "DeepSeek-V3 / R1 / V3.1",
        ("DeepseekV3ForCausalLM",),
        copy_policy=CopyPolicy.REQUIRED,
        megatron=_DEEPSEEK_MAPPING,
        serving=replace(_ROUTED, stored_copies=SHARED_HEAD),
        support=Support(writer=_DEEPSEEK_WRITER, accept=MEASURABLE),
        notes="embed_tokens and shared_head.head are stored copies of the main tensors",
    ),
    deepseek_style(
        "deepseek_v32",
        "DeepSeek-V3.2",
        ("DeepseekV32ForCausalLM",),
        tail=(*_SHARED_HEAD_NORM, "shared_head.head.weight"),
        copy_policy=CopyPolicy.REQUIRED,
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
    # Listed after DeepSeek-V3, whose architecture it shares: a config naming only that
    # architecture is DeepSeek-V3's.
    deepseek_style(
        "kimi_k2",
        "Kimi-K2",
        ("DeepseekV3ForCausalLM",),
        copy_policy=CopyPolicy.REQUIRED,
        megatron=_DEEPSEEK_MAPPING,
        serving=replace(_ROUTED, stored_copies=SHARED_HEAD),
        support=Support(writer=_DEEPSEEK_WRITER, build_as="deepseek_v3"),
        notes="DeepSeek-V3 architecture; released configs declare 0 MTP layers",
    ),
    deepseek_style(
        "glm4_moe",
        "GLM-4.5 / 4.6 / 4.7",
        ("Glm4MoeForCausalLM",),
        copy_policy=CopyPolicy.OPTIONAL,
        megatron=_DEEPSEEK_MAPPING,
        serving=replace(_ZEROES, stored_copies=SHARED_HEAD),
        support=Support(
            writer=MegatronWriter(
                "glm4_moe", "local", True, "GQA + q/k/v bias + qk-norm, MoE with shared experts"
            ),
            accept=MEASURABLE,
        ),
        notes="GLM-4.5 stores embed/head copies in the MTP layer, GLM-4.6 does not",
    ),
    deepseek_style(
        "glm4_moe_lite",
        "GLM-4.7-Flash",
        ("Glm4MoeLiteForCausalLM",),
        copy_policy=CopyPolicy.OPTIONAL,
        megatron=_DEEPSEEK_MAPPING,
        serving=_ZEROES,
    ),
    deepseek_style(
        "glm_moe_dsa",
        "GLM-5",
        ("GlmMoeDsaForCausalLM",),
        copy_policy=CopyPolicy.NONE,
        megatron=_DEEPSEEK_MAPPING,
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
    deepseek_style(
        "step3p5",
        "Step-3.5-Flash",
        ("Step3p5ForCausalLM",),
        tail=("transformer.shared_head.norm.weight", "transformer.shared_head.output.weight"),
        own_head="transformer.shared_head.output.weight",
        count=MtpCount(default=1),
        serving=_PRE_NORM_CHAIN,
        support=Support(
            elsewhere=(OtherConverter(MEGATRON_BRIDGE, "Step35Bridge", mtp=True),),
            accept=AcceptSupport(
                why_not="Step-3.5 releases ship remote code only (model_type step3p5 without a "
                "transformers class for the checkpoint's transformer.* names)"
            ),
        ),
        notes="3 dense MTP layers; each shared_head.output is trained on its own, not a copy",
    ),
    # Kimi-K3: SGLang kimi_k3.py, TokenSpeed kimi_k3_nextn.py; no transformers class (its text
    # model is kimi_linear). One DeepSeek-shaped layer after the KDA/MLA decoder.
    deepseek_style(
        "kimi_k3",
        "Kimi-K3",
        ("KimiK3ForConditionalGeneration",),
        root="language_model.model.",
        head="language_model.lm_head.weight",
        copy_policy=CopyPolicy.OPTIONAL,
    ),
    # transformers models/glm5_next (ignores r"layers\.45\." on load); SGLang glm5_next_nextn.py.
    # The MTP layer mirrors a DSA + MoE layer without the hyper-connection (hc_*) tensors.
    deepseek_style(
        "glm5_next",
        "GLM-5.3-Flash",
        ("Glm5NextForConditionalGeneration",),
        root="model.language_model.",
        block_lacks=("hc_",),
    ),
    # openPangu: vLLM openpangu_mtp.py (DeepSeek's MTP layer); remote code, no transformers class.
    deepseek_style(
        "pangu_ultra_moe",
        "openPangu Ultra MoE",
        ("PanguUltraMoEForCausalLM",),
        copy_policy=CopyPolicy.OPTIONAL,
    ),
    # transformers models/hy_v3 (ignores r"model\.layers\.80.*"); vLLM hy_v3_mtp.py, SGLang
    # hunyuan_v3_nextn.py ("released checkpoints store the draft head's output norm as
    # model.layers.<N>.final_layernorm.weight"). Stored embed/head copies are skipped by vLLM.
    deepseek_style(
        "hy_v3",
        "Hunyuan HY-V3",
        ("HYV3ForCausalLM",),
        tail=("final_layernorm.weight",),
        # Megatron-Bridge 0.6 hy_v3_bridge.py: router.gate -> router, shared_mlp ->
        # shared_experts, expert_bias -> router.expert_bias
        megatron=MegatronMapping(
            hf_aliases=(
                ("mlp.gate.e_score_correction_bias", "mlp.expert_bias"),
                ("mlp.gate.", "mlp.router.gate."),
                ("mlp.shared_experts.", "mlp.shared_mlp."),
            )
        ),
    ),
    # transformers models/bailing_hybrid (bailing_moe_v2 is remote code); SGLang
    # bailing_moe_nextn.py. Embedding is model.word_embeddings.
    deepseek_style(
        "bailing",
        "Ling / Ring 2.x (Bailing)",
        ("BailingHybridForCausalLM", "BailingMoeV2ForCausalLM"),
        model_types=("bailing_hybrid", "bailing_moe_v2", "bailing_moe"),
        tail=("final_layernorm.weight",),
        embed="word_embeddings.weight",
        serving=Serving(zeroes_position0=True),
        support=Support(
            accept=AcceptSupport(
                why_not="its MTP block keeps the release's tensor names (attention.dense, "
                "kv_a_proj_with_mqa, ...), which transformers renames while loading; accept maps "
                "names one to one and does not apply those renames yet"
            )
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
    deepseek_style(
        "sarvam_moe",
        "Sarvam-MoE",
        ("SarvamMoEForCausalLM",),
        embed="word_embeddings.weight",
        support=Support(
            accept=AcceptSupport(
                why_not="its MTP block keeps the release's tensor names "
                "(attention.query_key_value, ...), which transformers renames while loading; "
                "accept does not apply those yet"
            )
        ),
        notes="released checkpoints hold no MTP weights (transformers' config says so)",
    ),
    # transformers models/step3p7 (builds its ignore pattern from the count and loads the layers
    # in MtpModel for generate(use_mtp=True)); vLLM step3p5_mtp.py. Step-3.5's entry keeps its
    # transformer.shared_head.{norm,output} names; transformers' MtpModel reads these.
    # Serving (vLLM step3p5_mtp.py + v1/spec_decode/step3p5.py): depth d runs layer N+d, its
    # logits come from that layer's own shared_head.{norm,head}, and the block output before
    # shared_head.norm is chained to depth d+1 (transformers' MtpModel instead chains the
    # normed output and uses the main lm_head).
    deepseek_style(
        "step3p7",
        "Step-3.7",
        ("Step3p7ForConditionalGeneration",),
        tail=(*_SHARED_HEAD_NORM, "shared_head.head.weight"),
        own_head="shared_head.head.weight",
        head_parts=True,
        serving=_PRE_NORM_CHAIN,
        support=Support(accept=MEASURABLE),
        notes="3 MTP layers with sliding attention and a dense MLP, each with its own head",
    ),
)
