"""How one model family lays out its MTP layers: pure data, no code paths."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mtpcheck.families.serving import EngineCopies, EngineDefault, EngineLimit
from mtpcheck.model.modes import ChainHidden as ChainHidden  # re-exported: a family fact


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
    """What the layout needs, and why the model is or is not built, in words."""


@dataclass(frozen=True)
class OtherConverter:
    """A converter outside mtpcheck that converts the family between HF and Megatron, as
    mtpcheck's refusals name it (with the version its code was read in)."""

    tool: str
    """The tool and its version (``Megatron-Bridge 0.6.2``)."""
    part: str
    """What in the tool converts the family (its bridge class)."""
    mtp: bool
    """Whether it converts the MTP layers too (else a checkpoint it writes has none)."""

    def words(self) -> str:
        """The converter in a refusal: what it is, and whether the MTP layers come along."""
        mtp = "the MTP layers included" if self.mtp else "but not the MTP layers"
        return f"{self.tool}'s {self.part} converts it ({mtp})"


MEGATRON_BRIDGE = "Megatron-Bridge 0.6.2"
"""The Megatron-Bridge release whose bridges the family records name (this project's
third-party tier runs it: tests/thirdparty/megatron_bridge_062)."""


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
class MtpCount:
    """How a checkpoint's config declares the number of MTP layers it holds, and where its
    keys stand."""

    keys: tuple[str, ...] = ("num_nextn_predict_layers",)
    """Config keys (dotted for nesting) that declare the MTP count; the first present wins."""
    default: int | None = None
    """Count serving engines assume when no key is present; None means undeclared."""
    hidden_layers_key: str = "num_hidden_layers"
    """Config key of the main model's decoder layer count."""
    from_command_line: bool = False
    """Loaders are told the MTP count on their command line rather than reading it from the
    checkpoint (bare megatron-core ``dist_checkpointing.save`` output, as mbridge and verl
    write, records no args): an unrecorded count there is a warning, not damage."""
    keys_under_architecture: bool = False
    """Config keys also stand under the name the ``architecture`` key holds (GGUF metadata:
    ``glm4moe.expert_count``), where they are not at the top level."""
    unreliable_keys: tuple[str, ...] = ()
    """Config keys whose values say nothing of the layers, read as absent (llama.cpp's
    converter writes ``full_attention_interval`` whatever the layers are)."""


@dataclass(frozen=True)
class HfLayout:
    """Where a family's checkpoint stores its MTP layers, under which names.

    Templates are full tensor names with placeholders: ``{i}`` is the 0-based MTP depth and
    ``{n}`` the absolute layer number ``num_hidden_layers + i``. A template without either
    placeholder names a tensor shared by all MTP layers and is counted with layer 0. Where one
    depth spans several flat layers (``flat_layers_keys``), ``{i}`` in ``layer_prefix`` is the
    flat index, and ``{first}`` / ``{last}`` name the first and last flat layer of a depth.
    """

    layer_prefix: str
    """Prefix under which the MTP layer's own decoder block lives."""
    specific: tuple[str, ...]
    """MTP-only tensors (norms, projection) an MTP layer must hold."""
    projection: str
    """Template of the ``[H, 2H]`` projection tensor."""
    concat_order: ConcatOrder = ConcatOrder.EMBEDDING_FIRST
    """Which half of the projection's input multiplies the embedding."""
    copies: tuple[SharedCopy, ...] = ()
    """MTP tensors that are stored copies of main-model tensors."""
    copy_policy: CopyPolicy = CopyPolicy.NONE
    """Whether releases store ``copies``."""
    main_shared: tuple[str, ...] = ("model.embed_tokens.weight", "lm_head.weight")
    """Main tensors the MTP layer uses (embedding, output head); part of the MTP diff scope."""
    main_layer_prefix: str = "model.layers.{k}."
    """Prefix of main decoder layer ``{k}``."""
    main_norm: str = "model.norm.weight"
    """The main model's final norm (the HF <-> Megatron mapping's ``final_layernorm``)."""
    inner_mirrors_main: bool = True
    """True when the MTP decoder block has the tensor set of a main decoder layer."""
    head_parts: tuple[str, ...] | None = None
    """Templates of the MTP head's embedding norm, hidden norm, projection and final norm
    (megatron-core's ``enorm``, ``hnorm``, ``eh_proj``, ``final_layernorm``, in that order):
    what ``accept`` computes the head from, the shape checks size, and the HF <-> Megatron
    mapping maps; None where the registry does not name them."""
    head_output: str | None = None
    """Template of an output head each MTP layer holds for itself (Step's
    ``shared_head.head``), which serving engines use instead of the main ``lm_head``."""
    block_lacks: tuple[str, ...] = ()
    """Name prefixes (relative to a decoder layer) that main layers hold and MTP blocks do
    not, by design (HY-V4's hyper-connection weights)."""
    flat_layers_keys: tuple[tuple[str, str], ...] = ()
    """(MTP pattern key, main pattern key) pairs, tried in order, when one depth spans several
    flat layers (Nemotron-H): the MTP pattern's length is the layers a depth spans, and flat
    layer ``j`` mirrors main layers of the same pattern entry. Empty: one layer a depth."""


@dataclass(frozen=True)
class MegatronMapping:
    """How the family's HF names map onto megatron-core's (``mtpcheck.mapping``); the MTP
    head's own tensors map as :attr:`HfLayout.head_parts` names them."""

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


@dataclass(frozen=True)
class Serving:
    """What the serving engines that load the family's MTP layers do, where it matters to a
    check (see :mod:`mtpcheck.families.serving` for the engine facts' types)."""

    chain_hidden: ChainHidden = ChainHidden.POST_NORM
    """What depth d passes to depth d + 1 in the engine that serves the family."""
    first_state: ChainHidden = ChainHidden.POST_NORM
    """Which main-model state the serving engine feeds MTP depth 1: after ``model.norm``
    (vLLM's DeepSeek, GLM, Qwen loaders) or before it (``step3p5.py``)."""
    zeroes_position0: bool = False
    """The engine's MTP loader zeroes the embedding at position 0 (vLLM 0.32
    ``deepseek_mtp.py``, ``glm4_moe_mtp.py``, ``mimo_mtp.py``, ``bailing_moe_mtp.py``)."""
    defaults: tuple[EngineDefault, ...] = ()
    """Config keys the engine reads with defaults of its own that differ from what
    transformers builds."""
    limits: tuple[EngineLimit, ...] = ()
    """Config values outside which the engine refuses to build the drafter."""
    stored_copies: tuple[EngineCopies, ...] = ()
    """Whether engines draft through the MTP layer's stored embedding and head copies."""


@dataclass(frozen=True)
class Support:
    """What mtpcheck's own commands can do with the family."""

    writer: MegatronWriter | None = None
    """The built-in converter's megatron-core description; None: it cannot write the family
    (``--to-megatron`` with a converter of one's own still can)."""
    no_writer: str = ""
    """Why the built-in converter cannot write the family (where ``writer`` is None)."""
    elsewhere: tuple[OtherConverter, ...] = ()
    """Converters outside mtpcheck that convert the family, named where mtpcheck refuses."""
    accept: AcceptSupport = NOT_MEASURABLE
    """Whether ``accept`` computes the family's MTP head."""
    build_as: str | None = None
    """The transformers ``model_type`` ``--synthetic`` builds the main model with, where the
    family has no transformers class of its own (MiMo extends Qwen2); None: its own."""


@dataclass(frozen=True)
class MtpFamily:
    """One family of checkpoints with MTP layers: who it is, and a part per question (how the
    count is declared, where the layers lie, how they map to Megatron, how engines serve them,
    what mtpcheck can do with them)."""

    key: str
    """Registry key; also the ``model_type`` most checkpoints of the family carry."""
    display: str
    """The family's name in reports."""
    model_types: tuple[str, ...]
    """Config ``model_type`` values that select the family."""
    architectures: tuple[str, ...]
    """Config ``architectures`` entries that select the family."""
    layout: HfLayout
    """Where the checkpoint lays out the MTP layers."""
    count: MtpCount = MtpCount()
    """How the config declares how many there are."""
    megatron: MegatronMapping | None = None
    """How they map to megatron-core; None when mtpcheck has no HF <-> Megatron mapping for
    the family."""
    serving: Serving = Serving()
    """What serving engines do with them."""
    support: Support = Support()
    """What mtpcheck's own commands can do with the family."""
    drafter: Drafter = Drafter.INSIDE
    """Where the family's draft model ships."""
    nested_as: str = ""
    """Registry key of the family a checkpoint of this one is when its MTP depths nest
    layers (megatron-core's hybrid stack): chosen when the config holds that family's MTP
    pattern key, or its names nest; empty: none."""
    notes: str = ""
    """A line for the families table (docs/families.md)."""
