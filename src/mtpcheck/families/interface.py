"""How one model family lays out its MTP layers: pure data, no code paths."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CopyPolicy(str, enum.Enum):
    """Whether a family's HF checkpoints store MTP copies of main-model tensors."""

    REQUIRED = "required"
    """Official releases store them and serving engines load them; absence is damage."""
    OPTIONAL = "optional"
    """Some releases store them, some do not (GLM-4.5 does, GLM-4.6 does not)."""
    NONE = "none"
    """The family never stores them; the MTP layer reuses the main tensors."""


class ConcatOrder(str, enum.Enum):
    """Which half of the projection's 2H input columns multiplies which input."""

    EMBEDDING_FIRST = "embedding-first"
    """``proj(cat(norm(embedding), norm(hidden)))``: DeepSeek, GLM, Qwen3-Next, Megatron."""
    HIDDEN_FIRST = "hidden-first"
    """``proj(cat(norm(hidden), norm(embedding)))``: MiMo."""
    SPLIT = "split"
    """Two ``[H, H]`` projections, one per input, summed (DeepSeek-V4 ``e_proj`` / ``h_proj``)."""


class ChainHidden(str, enum.Enum):
    """Which hidden state of MTP depth d a serving engine feeds depth d + 1 (``accept`` with
    several MTP layers)."""

    POST_NORM = "post-norm"
    """The block output after the layer's final norm: megatron-core's
    ``MultiTokenPredictionBlock`` (it trains the chain), transformers' ``MtpModel`` and vLLM's
    MiMo-V2-Flash MTP."""
    PRE_NORM = "pre-norm"
    """The block output before the final norm, which only feeds the output head: vLLM's and
    SGLang's Step-3.5 MTP (``step3p5_mtp.py`` returns the block output, ``compute_logits``
    applies ``shared_head.norm``)."""


class Drafter(str, enum.Enum):
    """Where a family's draft model ships."""

    INSIDE = "inside"
    """MTP layers inside the checkpoint (every family but the ones below)."""
    SEPARATE = "separate"
    """A main model whose drafter ships as a checkpoint of its own (Gemma 4)."""
    IS_DRAFTER = "is-drafter"
    """The checkpoint is such a separate drafter (Gemma 4 assistant)."""


@dataclass(frozen=True)
class MegatronWriter:
    """How mtpcheck's built-in converter writes a family as a megatron-core checkpoint."""

    layout: str
    """Registry key of the family whose megatron-core model description the writer builds
    (Kimi-K2 is written as DeepSeek-V3: the same architecture)."""
    spec: str
    """``local`` (megatron-core's own modules) or ``te`` (needs Transformer Engine)."""
    builds_on_cpu: bool
    """Whether megatron-core builds a ``GPTModel`` of the family on CPU torch without
    Transformer Engine (else the writer writes the layout without building the model)."""
    note: str


@dataclass(frozen=True)
class AcceptSupport:
    """Whether ``accept`` can compute the family's MTP head, and if not, why."""

    measurable: bool = False
    why_not: str = ""
    """Said when ``accept`` refuses the family (empty: "not yet")."""


NOT_MEASURABLE = AcceptSupport()
MEASURABLE = AcceptSupport(measurable=True)
"""Families ``accept`` runs: each tested on a shipped fixture and checked against
transformers' own ``MtpModel`` (tests/test_accept_reference.py)."""


@dataclass(frozen=True)
class SharedCopy:
    """An MTP tensor that is a stored copy of a main-model tensor."""

    template: str
    """Name of the copy; ``{n}``/``{i}`` placeholders as in :class:`MtpFamily`."""
    main: str
    """Name of the main-model tensor it copies."""


@dataclass(frozen=True)
class MtpFamily:
    """The MTP layout of one family of checkpoints.

    Templates are full tensor names with placeholders: ``{i}`` is the 0-based MTP depth and
    ``{n}`` the absolute layer number ``num_hidden_layers + i``. A template without either
    placeholder names a tensor shared by all MTP layers and is counted with layer 0. Where one
    depth spans several flat layers (``flat_layers_key``), ``{i}`` in ``layer_prefix`` is the
    flat index, and ``{first}`` / ``{last}`` name the first and last flat layer of a depth.
    """

    key: str
    """Registry key; also the ``model_type`` most checkpoints of the family carry."""
    display: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    count_keys: tuple[str, ...]
    """Config keys (dotted for nesting) that declare the MTP count; the first present wins."""
    default_count: int | None
    """Count serving engines assume when no key is present; None means undeclared."""
    layer_prefix: str
    """Prefix under which the MTP layer's own decoder block lives."""
    specific: tuple[str, ...]
    """MTP-only tensors (norms, projection) an MTP layer must hold."""
    projection: str
    """Template of the ``[H, 2H]`` projection tensor."""
    concat_order: ConcatOrder
    copies: tuple[SharedCopy, ...] = ()
    copy_policy: CopyPolicy = CopyPolicy.NONE
    main_shared: tuple[str, ...] = ("model.embed_tokens.weight", "lm_head.weight")
    """Main tensors the MTP layer uses (embedding, output head); part of the MTP diff scope."""
    main_layer_prefix: str = "model.layers.{k}."
    main_norm: str = "model.norm.weight"
    """The main model's final norm (the HF <-> Megatron mapping's ``final_layernorm``)."""
    inner_mirrors_main: bool = True
    """True when the MTP decoder block has the tensor set of a main decoder layer."""
    hidden_layers_key: str = "num_hidden_layers"
    megatron_wrapper: tuple[str, ...] | None = None
    """HF templates of Megatron's ``enorm``, ``hnorm``, ``eh_proj``, ``final_layernorm`` (in
    that order); None when mtpcheck has no HF <-> Megatron mapping for the family."""
    head_parts: tuple[str, ...] | None = None
    """The same four templates for ``accept``'s MTP head, where the family has no Megatron
    mapping (else ``megatron_wrapper`` serves)."""
    head_output: str | None = None
    """Template of an output head each MTP layer holds for itself (Step's
    ``shared_head.head``), which serving engines use instead of the main ``lm_head``."""
    chain_hidden: ChainHidden = ChainHidden.POST_NORM
    """What depth d passes to depth d + 1 in the engine that serves the family."""
    engine_first_state: ChainHidden = ChainHidden.POST_NORM
    """Which main-model state the serving engine feeds MTP depth 1: after ``model.norm``
    (vLLM's DeepSeek, GLM, Qwen loaders) or before it (``step3p5.py``)."""
    engine_zeroes_position0: bool = False
    """The engine's MTP loader zeroes the embedding at position 0 (vLLM 0.32
    ``deepseek_mtp.py``, ``glm4_moe_mtp.py``, ``mimo_mtp.py``, ``bailing_moe_mtp.py``)."""
    gated_attention: bool = False
    """Attention with an output gate: HF ``q_proj`` holds ``[q; gate]`` per head (Qwen3-Next)."""
    shared_expert_style: str = "shared_experts"
    """HF name of the MoE shared expert block: ``shared_experts`` or Qwen's gated
    ``shared_expert``."""
    hybrid_layers: bool = False
    """Layers of a hybrid (Mamba) stack, each a ``norm`` and a ``mixer`` of one kind, mapped by
    the hybrid rules; MTP depth ``i`` is then megatron-core's ``mtp.layers.{i}`` holding one
    nested ``layers.{t}`` per flat HF layer (Nemotron-H)."""
    hf_aliases: tuple[tuple[str, str], ...] = ()
    """(canonical, family's own) name prefixes within a decoder layer, where the family's HF
    names differ from the DeepSeek / Qwen names the HF <-> Megatron rules are written in
    (HY-V3's ``mlp.router.gate.weight`` for ``mlp.gate.weight``); the first match applies."""
    gdn_split: bool = False
    """HF stores the gated delta net's input projection as four tensors, ``in_proj_qkv`` /
    ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a`` (Qwen3.5), not Qwen3-Next's two
    head-grouped ``in_proj_qkvz`` / ``in_proj_ba``."""
    block_lacks: tuple[str, ...] = ()
    """Name prefixes (relative to a decoder layer) that main layers hold and MTP blocks do
    not, by design (HY-V4's hyper-connection weights)."""
    flat_layers_keys: tuple[tuple[str, str], ...] = ()
    """(MTP pattern key, main pattern key) pairs, tried in order, when one depth spans several
    flat layers (Nemotron-H): the MTP pattern's length is the layers a depth spans, and flat
    layer ``j`` mirrors main layers of the same pattern entry. Empty: one layer a depth."""
    drafter: Drafter = Drafter.INSIDE
    writer: MegatronWriter | None = None
    """The built-in converter's megatron-core description; None: it cannot write the family
    (``--to-megatron`` with a converter of one's own still can)."""
    accept: AcceptSupport = NOT_MEASURABLE
    count_from_command_line: bool = False
    """Loaders are told the MTP count on their command line rather than reading it from the
    checkpoint (bare megatron-core ``dist_checkpointing.save`` output, as mbridge and verl
    write, records no args): an unrecorded count there is a warning, not damage."""
    notes: str = ""
