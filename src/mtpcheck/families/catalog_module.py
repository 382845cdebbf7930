"""Registry entries of the families that keep megatron-core's MTP module names, as data:
``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` around the mirrored decoder layer
(MiniMax, Hunyuan HY-V4), or around a small stack of hybrid layers a depth spans (Nemotron-H).

Each entry names where its layout was confirmed: the transformers model and the MTP loader of
a serving engine (vLLM ``vllm/model_executor/models/...`` or SGLang
``python/sglang/srt/models/...``).
"""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families.interface import (
    MEGATRON_BRIDGE,
    AcceptSupport,
    HfLayout,
    MegatronMapping,
    MtpCount,
    MtpFamily,
    OtherConverter,
    Serving,
    Support,
)
from mtpcheck.families.module_parts import (
    MODULE_PARTS,
    main_model_under,
    megatron_module,
    under,
)
from mtpcheck.families.serving import NEMOTRON_H_ONE_LAYER

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
        layout=main_model_under(
            megatron_module(root + "model.mtp.layers.{i}."),
            root + "model.",
            head=f"{root}lm_head.weight",
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

MODULE_STYLE: tuple[MtpFamily, ...] = (
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
        layout=main_model_under(
            HfLayout(
                layer_prefix="mtp.layers.{i}.",
                specific=_NEMOTRON_H_SPECIFIC,
                projection="mtp.layers.{first}.eh_proj.weight",
                flat_layers_keys=(
                    ("mtp_hybrid_override_pattern", "hybrid_override_pattern"),
                    ("mtp_layers_block_type", "layers_block_type"),
                ),
                head_parts=_NEMOTRON_H_SPECIFIC,
            ),
            "backbone.",
            embed="embeddings.weight",
            norm="norm_f.weight",
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
)
