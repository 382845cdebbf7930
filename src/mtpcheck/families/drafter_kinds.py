"""Drafters that ship beside their target model, as data: how each kind is recognised from its
config and tensor names, which config keys hold its widths, vocabulary and taps, which tensors
its flags imply, and how each serving engine is told to use it.

The facts come from the drafter formats' own code and the engines' loaders, as gathered in the
project's reference notes (vLLM and speculators 0.9 count auxiliary taps as hidden-state
indices, 0 the embeddings; z-lab DFlash and DeepSpec count the output of layer k). Checks and
the report read these records; nothing else names a drafter kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Taps(str, enum.Enum):
    """How a drafter's auxiliary layer ids number the target's hidden states."""

    HIDDEN_STATE = "hidden-state index"
    """0 is the embedding output, k the output of layer k-1, up to n for the last of n layers
    (vLLM 0.32 taps before the first layer and after each: ``_maybe_add_hidden_state``;
    speculators)."""
    LAYER_OUTPUT = "layer output"
    """k is the output of 0-based layer k (z-lab DFlash, DeepSpec; -1 the embedding)."""
    NONE = "none"
    """The drafter reads the target's last hidden state only."""


class Shared(str, enum.Enum):
    """Whether a drafter's embedding and head are its own or the target's."""

    OWN_OR_TARGET = "own or target"
    """It may ship its own; vLLM keeps a copy that differs from the target's, SGLang takes the
    target's (EAGLE kinds)."""
    TARGET = "target"
    """It ships neither: the engine uses the target's (DFlash, exported NextN)."""
    OWN = "own"
    """It ships its own and the engines use them (Gemma-4 assistant)."""


@dataclass(frozen=True)
class Engines:
    """How each engine is told to draft with this kind; empty where no setting is known."""

    vllm: str = ""
    """The ``method`` of vLLM's ``--speculative-config``."""
    vllm_note: str = ""
    sglang: str = ""
    """SGLang's ``--speculative-algorithm``."""
    llama_cpp: str = ""
    """llama.cpp's ``--spec-type`` (the drafter converted to GGUF, given with ``-md``)."""
    other: str = ""
    """Anything else a user must know to serve it, in words."""


@dataclass(frozen=True)
class FlagTensor:
    """A config flag and the tensor it makes the drafter hold (``{i}``: one per tap)."""

    key: str
    tensor: str
    """The tensor's name; ``{i}`` stands for each auxiliary tap's position."""
    engine_note: str
    """What goes wrong when the two disagree."""


@dataclass(frozen=True)
class Width:
    """A tensor dimension the config fixes: ``times`` x the drafter's ``hidden`` or the
    ``target_hidden`` width it was built for."""

    tensor: str
    dim: int
    times: int
    of: str
    """``hidden`` or ``target_hidden``."""
    what: str
    """What the dimension holds, in words."""


@dataclass(frozen=True)
class ConfigPaths:
    """Where a kind's config holds each quantity: dotted paths tried in order."""

    vocab: tuple[str, ...] = ("vocab_size",)
    hidden: tuple[str, ...] = ("hidden_size",)
    target_hidden: tuple[str, ...] = ("target_hidden_size",)
    draft_vocab: tuple[str, ...] = ("draft_vocab_size",)
    taps: tuple[str, ...] = ()
    positions: tuple[str, ...] = ("max_position_embeddings",)
    rope: tuple[str, ...] = ("rope_parameters", "rope_theta")
    layers: tuple[str, ...] = ("num_hidden_layers",)
    layer_types: tuple[str, ...] = ("layer_types", "text_config.layer_types")


@dataclass(frozen=True)
class Recognition:
    """What names a kind: any one of these in the config, or the tensors below."""

    speculators_types: tuple[str, ...] = ()
    """``speculators_model_type`` values (vllm-project/speculators' format)."""
    architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    config_values: tuple[tuple[str, str], ...] = ()
    """(dotted config key, value) pairs, any one of which names the kind (SpecForge's DSpark
    is a ``DFlashDraftModel`` with ``dflash_config.projector_type: dspark``)."""
    tensors: tuple[str, ...] = ()
    """Name prefixes that all appear: recognises a drafter whose config names a plain
    architecture (SafeAILab's EAGLE-3 saved as ``LlamaForCausalLM``)."""


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter that ships beside its target."""

    key: str
    display: str
    recognition: Recognition
    paths: ConfigPaths
    required: tuple[str, ...]
    """Tensor names (or name prefixes ending in ``.``) every drafter of the kind holds."""
    taps: Taps
    shared: Shared
    engines: Engines
    checked: str
    """What mtpcheck checks of it, in words (the docs' table)."""
    not_checked: str = ""
    """What it does not check, in words."""
    flags: tuple[FlagTensor, ...] = ()
    vocab_maps: bool = False
    """Whether a reduced draft vocabulary is mapped by ``d2t`` / ``t2d``."""
    fc_width_taps: bool = False
    """Whether ``fc.weight``'s input width is taps x target width."""
    widths: tuple[Width, ...] = ()
    """Further dimensions the config fixes."""
    reads_target_kv: bool = False
    """Whether it drafts from the target's KV cache of its last layers (the Gemma-4 assistant),
    so its ``layer_types`` must be among those layers' types."""
    divides: tuple[tuple[str, str], ...] = ()
    """(config key, quantity) pairs where the key's value must divide the quantity
    (``num_centroids`` divides the vocabulary)."""
    renames: tuple[tuple[str, str], ...] = ()
    """An MTP layer taken out of a target: (the target's name prefix, the drafter's) for
    each part, ``{mtp}`` standing for the target's MTP layer prefix; the drafter is then
    compared with the target's MTP layer, bit for bit."""
    dropped: tuple[str, ...] = ()
    """Name ends of the target's MTP layer that the extraction leaves out on purpose."""
    unused: tuple[str, ...] = ()
    """Tensors the format stores and the drafter never reads (speculators 0.9's MTP format
    writes ``verifier_lm_head.weight`` without loading it: ``models/mtp/core.py``)."""
    taps_read: tuple[tuple[str, str], ...] = ()
    """(reader, what it does with the taps as written), for the report."""

    @property
    def mtp_extract(self) -> bool:
        """Whether the drafter is an MTP layer taken out of a target."""
        return bool(self.renames)


_EAGLE3_FLAGS = (
    FlagTensor(
        "norm_before_fc",
        "input_norm.weight",
        "an engine that ignores the flag skips the norm, and acceptance falls (sglang PR #32334)",
    ),
    FlagTensor(
        "fc_norm",
        "fc_norm.{i}.weight",
        "each tap is normed before the fusion only when both the flag and the norms are there",
    ),
)
_MASK = FlagTensor(
    "mask_token_id",
    "mask_hidden",
    "vLLM's parallel drafting reads mask_hidden for the masked positions; without it the "
    "drafter does not load",
)
_SPECULATORS = ConfigPaths(
    vocab=("transformer_layer_config.vocab_size", "vocab_size"),
    hidden=("transformer_layer_config.hidden_size", "hidden_size"),
    taps=("eagle_aux_hidden_state_layer_ids",),
    positions=("transformer_layer_config.max_position_embeddings", "max_position_embeddings"),
    rope=(
        "transformer_layer_config.rope_parameters",
        "transformer_layer_config.rope_theta",
        "rope_parameters",
        "rope_theta",
    ),
    layers=("transformer_layer_config.num_hidden_layers", "num_hidden_layers"),
)
_HIDDEN_STATE_READERS = (
    ("vLLM 0.32", "reads them as written: 0 the embedding, k the output of layer k - 1"),
    ("llama.cpp's converter (0.3.36)", "copies them to the GGUF key eagle3.target_layers"),
    ("SGLang", "guesses their numbering from the first id (SGLang PR #25454)"),
)
_LAYER_OUTPUT_READERS = (
    ("vLLM 0.32", "reads k as the output of 0-based layer k"),
    ("llama.cpp's converter (0.3.36)", "adds one and writes them as dflash.target_layers"),
    ("SGLang", "guesses their numbering from the first id (SGLang PR #25454)"),
)
_NATIVE_READERS = (
    (
        "SpecForge 0.2.0",
        "trains on them as 0-based layer indices: SGLang 0.5.14 adds one and captures the "
        "output of layer k",
    ),
    (
        "vLLM 0.32",
        "reads them as written: 0 the embedding, k the output of layer k - 1 (one layer "
        "earlier than SpecForge trained on)",
    ),
    ("llama.cpp's converter (0.3.36)", "copies them to the GGUF key eagle3.target_layers"),
)
"""A native EAGLE-3 config does not say which trainer numbered its taps."""
_EAGLE3_CHECKED = (
    "the tensors its config implies (each flag with its tensor), fc's width against its taps "
    "and the target's width, the d2t / t2d maps, the taps; with --target: vocabulary, widths, "
    "taps inside the target, embedding and head against the target's, verifier, positions "
    "and rope"
)
_VLLM_EAGLE3 = Engines(
    vllm="eagle3",
    sglang="EAGLE3",
    llama_cpp="draft-eagle3",
)

DRAFTER_KINDS: tuple[DrafterKind, ...] = (
    DrafterKind(
        key="eagle3-speculators",
        display="EAGLE-3 (speculators format)",
        recognition=Recognition(speculators_types=("eagle3",)),
        paths=_SPECULATORS,
        required=("fc.weight", "norm.weight", "lm_head.weight", "layers.0."),
        taps=Taps.HIDDEN_STATE,
        taps_read=_HIDDEN_STATE_READERS,
        shared=Shared.OWN_OR_TARGET,
        engines=Engines(
            vllm="eagle3",
            vllm_note="`vllm serve DRAFTER` also works: vLLM reads the target from "
            "speculators_config.verifier (no revision recorded)",
            sglang="EAGLE3",
        ),
        checked=_EAGLE3_CHECKED,
        flags=_EAGLE3_FLAGS,
        vocab_maps=True,
        fc_width_taps=True,
    ),
    DrafterKind(
        key="peagle",
        display="P-EAGLE (speculators format)",
        recognition=Recognition(speculators_types=("peagle",)),
        paths=_SPECULATORS,
        required=("fc.weight", "norm.weight", "lm_head.weight", "layers.0."),
        taps=Taps.HIDDEN_STATE,
        taps_read=_HIDDEN_STATE_READERS,
        shared=Shared.OWN_OR_TARGET,
        engines=Engines(vllm="eagle3", vllm_note="vLLM serves it as eagle3 with parallel drafting"),
        checked=_EAGLE3_CHECKED + "; mask_token_id with mask_hidden",
        flags=(*_EAGLE3_FLAGS, _MASK),
        vocab_maps=True,
        fc_width_taps=True,
    ),
    DrafterKind(
        key="eagle3",
        display="EAGLE-3 (native: SafeAILab, SpecForge, ModelOpt)",
        recognition=Recognition(
            architectures=("LlamaForCausalLMEagle3",), tensors=("midlayer.", "fc.weight")
        ),
        paths=ConfigPaths(taps=("eagle_config.eagle_aux_hidden_state_layer_ids",)),
        required=("fc.weight", "norm.weight", "lm_head.weight", "midlayer."),
        taps=Taps.HIDDEN_STATE,
        taps_read=_NATIVE_READERS,
        shared=Shared.OWN_OR_TARGET,
        engines=_VLLM_EAGLE3,
        checked=_EAGLE3_CHECKED,
        flags=_EAGLE3_FLAGS,
        vocab_maps=True,
        fc_width_taps=True,
    ),
    DrafterKind(
        key="dspark",
        display="DSpark",
        recognition=Recognition(
            speculators_types=("dspark",),
            architectures=("Qwen3DSparkModel",),
            config_values=(("dflash_config.projector_type", "dspark"),),
            tensors=("markov_head.", "fc.weight"),
        ),
        paths=ConfigPaths(taps=("target_layer_ids", "dflash_config.target_layer_ids")),
        required=("fc.weight", "norm.weight", "markov_head.", "layers.0."),
        taps=Taps.LAYER_OUTPUT,
        taps_read=_LAYER_OUTPUT_READERS,
        shared=Shared.TARGET,
        engines=Engines(
            vllm="dspark",
            sglang="DSPARK",
            other="llama.cpp's converter (0.3.36) writes a DSpark drafter as its dflash "
            "architecture",
        ),
        checked="the tensors its kind holds, fc's width, the taps; with --target: widths and "
        "taps inside the target",
        not_checked="the Markov and confidence heads' shapes against the vocabulary",
        fc_width_taps=True,
    ),
    DrafterKind(
        key="dflash-speculators",
        display="DFlash (speculators format)",
        recognition=Recognition(speculators_types=("dflash",)),
        paths=replace(_SPECULATORS, taps=("aux_hidden_state_layer_ids",)),
        required=("fc.weight", "norm.weight", "layers.0."),
        taps=Taps.HIDDEN_STATE,
        taps_read=_HIDDEN_STATE_READERS,
        shared=Shared.TARGET,
        engines=Engines(
            vllm="dflash",
            vllm_note="vLLM passes its taps on to the DFlash model less one (its layer-output "
            "numbering)",
            sglang="DFLASH",
            llama_cpp="draft-dflash",
        ),
        checked="the tensors its kind holds, fc's width, the taps; with --target: vocabulary, "
        "widths, taps inside the target",
        fc_width_taps=True,
    ),
    DrafterKind(
        key="dflash",
        display="DFlash (z-lab, SpecForge)",
        recognition=Recognition(architectures=("DFlashDraftModel",)),
        paths=ConfigPaths(taps=("dflash_config.target_layer_ids", "target_layer_ids")),
        required=("fc.weight", "hidden_norm.weight", "norm.weight", "layers.0."),
        taps=Taps.LAYER_OUTPUT,
        taps_read=_LAYER_OUTPUT_READERS,
        shared=Shared.TARGET,
        engines=Engines(vllm="dflash", sglang="DFLASH", llama_cpp="draft-dflash"),
        checked="the tensors its kind holds, fc's width, the taps; with --target: vocabulary, "
        "widths, taps inside the target",
        fc_width_taps=True,
    ),
    DrafterKind(
        key="nextn-export",
        display="DeepSeek NextN layer exported by SGLang",
        recognition=Recognition(architectures=("DeepseekV3ForCausalLMNextN",)),
        paths=ConfigPaths(),
        required=(
            "model.layers.0.enorm.weight",
            "model.layers.0.hnorm.weight",
            "model.layers.0.eh_proj.weight",
            "model.layers.0.shared_head.norm.weight",
        ),
        taps=Taps.NONE,
        shared=Shared.TARGET,
        engines=Engines(
            sglang="NEXTN",
            other="SGLang's draft path is optional since its PR #5793, which reads the layer "
            "from the target itself",
        ),
        checked="its layer's tensors; with --target or diff: every tensor against the "
        "target's MTP layer, bit for bit, and no tensor of that layer left out but the "
        "embedding and head the exporter drops on purpose",
        renames=(("{mtp}", "model.layers.0."),),
        dropped=("embed_tokens.weight", "shared_head.head.weight"),
    ),
    DrafterKind(
        key="mtp-speculators",
        display="MTP layer (speculators format)",
        recognition=Recognition(speculators_types=("mtp",), architectures=("MTPDraftModel",)),
        paths=_SPECULATORS,
        required=("mtp_layers.0.",),
        taps=Taps.NONE,
        shared=Shared.TARGET,
        engines=Engines(
            other="`speculators stitch-mtp` (0.9.0) writes it back into the target, which is "
            "then served with its own MTP method",
        ),
        checked="its layer's tensors; with --target or diff: every tensor against the "
        "target's MTP layer in speculators' names, bit for bit (fused experts slice by slice)",
        renames=(
            ("mtp.fc.", "mtp_layers.0.input_proj."),
            ("mtp.norm.", "mtp_layers.0.final_layernorm."),
            ("mtp.pre_fc_norm_hidden.", "mtp_layers.0.hidden_layernorm."),
            ("mtp.pre_fc_norm_embedding.", "mtp_layers.0.token_layernorm."),
            ("mtp.layers.0.", "mtp_layers.0."),
        ),
        unused=("verifier_lm_head.weight",),
    ),
    DrafterKind(
        key="mtp-head",
        display="standalone MTP head",
        recognition=Recognition(model_types=("minimax_m3_mtp", "glm_moe_dsa_mtp")),
        paths=ConfigPaths(),
        required=("mtp.",),
        taps=Taps.NONE,
        shared=Shared.TARGET,
        engines=Engines(vllm="mtp"),
        checked="with --target: every tensor against the target's MTP layer where the target "
        "still holds one, bit for bit",
        not_checked="the head's completeness against its own model definition",
        renames=(("", ""),),
    ),
    DrafterKind(
        key="gemma4-assistant",
        display="Gemma-4 assistant",
        recognition=Recognition(model_types=("gemma4_assistant", "gemma4_unified_assistant")),
        paths=ConfigPaths(
            vocab=("text_config.vocab_size", "vocab_size"),
            hidden=("text_config.hidden_size",),
            target_hidden=("backbone_hidden_size",),
            positions=("text_config.max_position_embeddings",),
            rope=(),
            layers=("text_config.num_hidden_layers",),
        ),
        required=("pre_projection.weight", "post_projection.weight"),
        taps=Taps.NONE,
        shared=Shared.OWN,
        engines=Engines(
            vllm="mtp",
            sglang="FROZEN_KV_MTP",
            other="TensorRT-LLM: decoding_type MTP; SGLang refuses it as EAGLE3",
        ),
        checked="projection widths, vocabulary against its centroids; with --target: "
        "backbone width, vocabulary, the layer types against the target's last two layers'",
        widths=(
            Width("pre_projection.weight", 1, 2, "target_hidden", "embedding and backbone state"),
            Width("post_projection.weight", 0, 1, "target_hidden", "the backbone's width"),
        ),
        divides=(("num_centroids", "vocab"),),
        reads_target_kv=True,
        not_checked="the centroids against the vocabulary beyond vocab_size % num_centroids",
    ),
    DrafterKind(
        key="eagle",
        display="EAGLE-1/2",
        recognition=Recognition(tensors=("fc.weight", "layers.0.")),
        paths=ConfigPaths(),
        required=("fc.weight", "layers.0."),
        taps=Taps.NONE,
        shared=Shared.OWN_OR_TARGET,
        engines=Engines(vllm="eagle", sglang="EAGLE"),
        checked="fc's width (2 x hidden); with --target: vocabulary, width, embedding against "
        "the target's",
        widths=(Width("fc.weight", 1, 2, "target_hidden", "embedding and hidden state"),),
    ),
    DrafterKind(
        key="medusa",
        display="Medusa",
        recognition=Recognition(model_types=("medusa",), architectures=("MedusaModel",)),
        paths=ConfigPaths(),
        required=(),
        taps=Taps.NONE,
        shared=Shared.TARGET,
        engines=Engines(vllm="medusa"),
        checked="its kind only",
        not_checked="its heads (named, not checked)",
    ),
    DrafterKind(
        key="mlp-speculator",
        display="MLP speculator",
        recognition=Recognition(
            model_types=("mlp_speculator",), architectures=("MLPSpeculatorPreTrainedModel",)
        ),
        paths=ConfigPaths(),
        required=(),
        taps=Taps.NONE,
        shared=Shared.TARGET,
        engines=Engines(
            vllm="mlp_speculator", vllm_note="crashes at start-up in vLLM's V1 engine (vllm#47825)"
        ),
        checked="its kind only",
        not_checked="its heads (named, not checked)",
    ),
)
"""Every kind, in the order recognition tries them (specific before generic)."""

DRAFTER_KIND_BY_KEY = {k.key: k for k in DRAFTER_KINDS}

LOOKS_LIKE_A_DRAFTER = ("Eagle", "Draft", "Speculator", "DFlash", "DSpark", "Medusa")
"""Architecture name parts that mark a drafter of a kind not listed: reported as unknown."""

DEFAULT_TAPS = ("vLLM 0.32", "speculators", "llama.cpp's converter (0.3.36)")
"""Who falls back to taps (2, n // 2, n - 3) of the target's n layers when a drafter's config
names none (llama.cpp's converter writes them as ``eagle3.target_layers``)."""

DSPARK_INSIDE_KEYS = ("dspark_block_size", "dspark_target_layer_ids", "dspark_markov_rank")
"""Keys with which a target (DeepSeek-V4-Flash-0731, V4.1) says its ``mtp.*`` tensors are a
DSpark drafter, not MTP layers."""

FROZEN_EMBEDDING: tuple[tuple[str, object], ...] = (("embed_requires_grad", False),)
"""(config key, value) pairs with which a drafter says its embedding is the target's, frozen
in training (speculators 0.9's ``embed_requires_grad: false``): then a copy that differs from
the target's is a defect, for vLLM keeps it."""
