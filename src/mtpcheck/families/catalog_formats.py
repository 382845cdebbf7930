"""Registry entries of checkpoint formats whatever model they hold, as data: Megatron's
canonical names (a GPT model, or megatron-core's hybrid stack) and llama.cpp's GGUF names."""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families.interface import (
    AcceptSupport,
    CopyPolicy,
    HfLayout,
    MtpCount,
    MtpFamily,
    SharedCopy,
    Support,
)
from mtpcheck.families.module_parts import megatron_module
from mtpcheck.families.name_templates import NameTemplate

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
    nested_as="megatron_hybrid",
)
"""Megatron checkpoints, whatever model they hold, in mtpcheck's canonical names."""

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
        specific=tuple(NameTemplate(t).renamed("i", "d").text for t in MEGATRON.layout.specific),
        projection="mtp.layers.{d}.eh_proj.weight",
        flat_layers_keys=((HYBRID_MTP_PATTERN, "hybrid_layer_pattern"),),
    ),
    notes="megatron-core's hybrid stack (Nemotron-H): each MTP depth is a small stack of "
    "layers (the MTP pattern), each mirroring a main layer of its kind; "
    "hybrid_layer_pattern is the main pattern, then '/', then the MTP pattern",
)
"""Megatron checkpoints of megatron-core's hybrid model (``mtp_hybrid_override_pattern`` in
their config), whose MTP block nests ``layers.{t}`` (Megatron-Bridge 0.6 ``nemotron_h``). A
``megatron`` checkpoint is one (its record's ``nested_as``) when its config holds that key or
its MTP names nest layers."""

_NEXTN = "blk.{n}.nextn."
GGUF = MtpFamily(
    key="gguf",
    display="GGUF (llama.cpp)",
    model_types=("gguf",),
    architectures=(),
    count=MtpCount(
        ("nextn_predict_layers",),
        keys_under_architecture=True,
        unreliable_keys=("full_attention_interval",),
    ),
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
"""GGUF files as llama.cpp's ``convert_hf_to_gguf.py`` writes them, whatever the model: its
metadata keys stand under the architecture's name, and llama.cpp writes
``full_attention_interval`` whatever the layers are."""

FORMATS: tuple[MtpFamily, ...] = (MEGATRON, MEGATRON_HYBRID, GGUF)
