"""What serving engines build from a checkpoint's config, where it is not what transformers
builds: as data, each fact with the engine version and the loader file it was read from.
The registry attaches them to the families they hold for (``MtpFamily.serving``).

vLLM reads a known ``model_type``'s config through transformers' own config class, so a key
that class defines gets transformers' default when config.json lacks it; only keys the class
does not define fall back to the engine's ``getattr(config, key, default)``. Those are the
keys listed here.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM = "vLLM 0.32.0"


@dataclass(frozen=True)
class EngineSource:
    """Where a fact about an engine was read: the engine and version, and its file."""

    engine: str
    file: str
    """Repository-relative: the loader or model file that holds the behaviour."""


@dataclass(frozen=True)
class EngineDefault:
    """A config key the engine reads with a default of its own, which differs from what
    transformers builds for the family."""

    source: EngineSource
    """The engine, and its file that reads the key."""
    key: str
    engine_default: object
    """What the engine uses when the key is absent."""
    trained: object
    """The value transformers builds the family with (it does not read the key)."""
    effect: str
    """What the engine builds otherwise, in words."""
    refused_with: str = ""
    """A tensor name suffix: a checkpoint holding such a tensor is refused outright."""
    refusal: str = ""
    """What the engine then says (confirmed end to end: ``tests/test_serving.py``)."""


@dataclass(frozen=True)
class EngineLimit:
    """A config value outside which the engine refuses to build the drafter."""

    source: EngineSource
    key: str
    allowed: tuple[object, ...]
    default: object
    refusal: str
    """The engine's own words when it refuses."""


@dataclass(frozen=True)
class EngineCopies:
    """Whether the engine drafts through the MTP layer's stored embedding and head copies."""

    source: EngineSource
    uses_stored: bool


_DEEPSEEK_MOE = EngineSource(VLLM, "vllm/model_executor/models/deepseek_v2.py")
DEEPSEEK_ROUTER = (
    EngineDefault(
        _DEEPSEEK_MOE,
        "scoring_func",
        "softmax",
        "sigmoid",
        "routes every MoE layer, the MTP layer's included, with softmax scores instead of sigmoid",
    ),
    EngineDefault(
        _DEEPSEEK_MOE,
        "topk_method",
        None,
        "noaux_tc",
        "builds no e_score_correction_bias: expert selection ignores the trained bias",
        refused_with="mlp.gate.e_score_correction_bias",
        refusal="KeyError: 'layers.1.mlp.gate.e_score_correction_bias' in load_weights",
    ),
)
"""transformers 5.24's DeepSeek-V3 router (``DeepseekV3TopkRouter``, and GLM-5's, which is
the same) always scores with sigmoid and always adds ``e_score_correction_bias``; its config
classes define neither key. vLLM's ``DeepseekV2MoE`` reads both with defaults of its own."""
SHARED_HEAD = (EngineCopies(EngineSource(VLLM, "vllm/v1/spec_decode/llm_base_proposer.py"), False),)
"""vLLM's MTP proposer shares the target's embedding and head with the MTP layer
(``_maybe_share_embeddings`` / ``_maybe_share_lm_head``)."""
NEMOTRON_H_ONE_LAYER = (
    EngineLimit(
        EngineSource(VLLM, "vllm/model_executor/models/nemotron_h_mtp.py"),
        "num_nextn_predict_layers",
        (1,),
        1,
        "Only one MTP layer is supported for NemotronH-MTP",
    ),
)
"""vLLM's Nemotron-H MTP loader builds one MTP layer only."""
