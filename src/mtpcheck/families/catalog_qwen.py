"""Registry entries of the Qwen-style families, as data: Qwen3-Next's top-level ``mtp.`` block,
``mtp.fc`` over cat(``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``), then
``mtp.layers.{i}``, beside a main model under a root of its own.

Each entry names where its layout was confirmed: the transformers model and the MTP loader of
a serving engine (vLLM ``vllm/model_executor/models/...`` or SGLang
``python/sglang/srt/models/...``).
"""

from __future__ import annotations

from mtpcheck.families.interface import (
    MEASURABLE,
    MEGATRON_BRIDGE,
    NOT_MEASURABLE,
    AcceptSupport,
    ConcatOrder,
    HfLayout,
    MegatronMapping,
    MegatronWriter,
    MtpCount,
    MtpFamily,
    OtherConverter,
    Support,
)
from mtpcheck.families.module_parts import main_model_under

_QWEN_COUNT = MtpCount(("mtp_num_hidden_layers", "num_nextn_predict_layers"), default=1)
_NEXTN_ONE = MtpCount(default=1)

QWEN_HEAD_PARTS = (
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.fc.weight",
    "mtp.norm.weight",
)
"""Megatron's enorm, hnorm, eh_proj and final_layernorm of the one MTP layer (Megatron-Bridge
0.6 ``qwen35_bridge.py``: ``mtp.layers.0.{enorm, hnorm, eh_proj, final_layernorm}``)."""


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
    cat(``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``), then ``mtp.layers.{i}``; the main
    model under ``root``; ``megatron``: the HF <-> Megatron mapping of that block
    (Megatron-Bridge's), if any."""
    return MtpFamily(
        key=key,
        display=display,
        model_types=model_types,
        architectures=architectures,
        count=count,
        layout=main_model_under(
            HfLayout(
                layer_prefix="mtp.layers.{i}.",
                specific=("mtp.fc.weight", *QWEN_HEAD_PARTS[:2], "mtp.norm.weight"),
                projection="mtp.fc.weight",
                head_parts=QWEN_HEAD_PARTS,
            ),
            root,
        ),
        megatron=megatron,
        support=Support(writer=writer, accept=accept, no_writer=no_writer, elsewhere=elsewhere),
        notes=notes,
    )


_QWEN_MAPPING = MegatronMapping(
    gated_attention=True, shared_expert_style="shared_expert", gdn_split=True
)
"""Qwen3.5's: gated attention, Qwen's gated shared expert, the four-tensor delta-net input."""
_HC_SPLIT = AcceptSupport(
    why_not="split projections over hyper-connection streams are not built yet"
)


def _qwen4_exp(key: str, model_type: str, architecture: str, root: str) -> MtpFamily:
    """Qwen3.8's ``mtp.`` block: no concat, the embedding and each hyper-connection stream of
    the hidden state projected apart and summed; the main model under ``root``."""
    return MtpFamily(
        key=key,
        display="Qwen3.8-Flash-Next (qwen4_exp)",
        model_types=(model_type,),
        architectures=(architecture,),
        count=_QWEN_COUNT,
        layout=main_model_under(
            HfLayout(
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
                block_lacks=("ple.",),
            ),
            root,
            norm="hyper_connection_mixer.hc_norm.weight",  # no final norm of its own
        ),
        support=Support(accept=_HC_SPLIT),
        notes="main layers with per-layer embeddings (ple.*) have them; the MTP block does not",
    )


QWEN_STYLE: tuple[MtpFamily, ...] = (
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
)
