"""What a config says the main model holds: how many decoder layers, what kind each layer is,
how many routed experts an MoE layer has, and whether the head is tied to the embedding.

Pure reading of the config, no tensor names: the main-model check
(:mod:`mtpcheck.checks.main_model_checks`) holds a checkpoint's tensors to it. A layer's
*kind* is every per-layer fact the config states for it (its attention kind, dense or MoE MLP,
its indexer); layers of one kind hold the same tensors, so each is checked against the others.
Kinds are split generously: two layers the config describes alike and that still differ by
design would be a false alarm, two kinds that are really one only weaken the cross-check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.families.interface import MtpFamily
from mtpcheck.families.layout import hidden_layer_count, tied_head
from mtpcheck.model.config_keys import TEXT_ROOTS, is_int, lookup, text_value

PER_LAYER_SUFFIXES = ("_types", "layers_block_type", "_pattern")
"""Config keys that list one entry per decoder layer end so (``layer_types``,
``mlp_layer_types``, ``indexer_types``, Nemotron-H's ``layers_block_type``, Megatron's
``hybrid_override_pattern``); keys of the MTP block (``mtp_*``) describe other layers."""

NOT_PER_LAYER = frozenset({"architectures", "bos_token_id", "eos_token_id", "pad_token_id"})
"""Lists a config holds that are no per-layer fact, whatever their length."""

EXPERT_COUNT_KEYS = (
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "moe_num_experts",
    "expert_count",
)
"""Config keys of the routed expert count of an MoE layer (HF, Megatron, GGUF)."""

MOE_KINDS = frozenset({"moe", "sparse", "hash_moe", "E"})
"""Per-layer MLP kinds that mean routed experts (``mlp_layer_types``, ``layers_block_type``,
Megatron's hybrid pattern letter)."""


@dataclass(frozen=True)
class MainLayout:
    """The main model as the config describes it."""

    layers: int | None
    """Decoder layers; None when the config does not say."""
    kinds: tuple[tuple[tuple[str, str], ...], ...]
    """Per layer, the (key, value) facts the config states about it; empty tuples when it
    states none."""
    experts: int | None
    """Routed experts of an MoE layer; None when the config names none."""
    moe_layers: frozenset[int] | None
    """Layers the config makes MoE; None when it does not say which."""
    tied: bool
    """The output head is the embedding (no head tensor of its own)."""

    def kind_words(self, k: int) -> str:
        """Layer ``k``'s kind for a message (``full_attention, sparse``): its named facts, not
        its numbers (per-layer rope bases or compression ratios also split kinds)."""
        if not self.kinds:
            return ""
        return ", ".join(v for _, v in self.kinds[k] if not v.replace(".", "", 1).isdigit())


def _value(config: Mapping[str, Any], key: str, family: MtpFamily) -> Any:
    """``key`` at the top level, under ``text_config``, or (GGUF) under the architecture;
    None for a key the family's configs hold without meaning."""
    if key in family.count.unreliable_keys:
        return None
    found = text_value(config, key)
    if found is not None:
        return found[1]
    arch = config.get("architecture") if family.count.keys_under_architecture else None
    return config.get(f"{arch}.{key}") if isinstance(arch, str) else None


def _int(config: Mapping[str, Any], key: str, family: MtpFamily) -> int | None:
    value = _value(config, key, family)
    return int(value) if is_int(value) and value >= 0 else None


def per_layer_keys(config: Mapping[str, Any], lengths: frozenset[int]) -> list[tuple[str, str]]:
    """(root, key) of every per-layer fact the config lists, ``root`` one of
    :data:`~mtpcheck.model.config_keys.TEXT_ROOTS`: a list of scalars (``layer_types``,
    ``mlp_layer_types``, DeepSeek-V4's ``compress_ratios``, Step's per-layer ``rope_theta``,
    MiniMax's ``attn_type_list``), or a string pattern (``*_pattern``, ``layers_block_type``;
    a Megatron pattern's main part, before ``/``), of one of ``lengths`` entries. Keys of the
    MTP block (``mtp_*``) describe other layers and are left out."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for root in TEXT_ROOTS:
        for key, value in _node(config, root).items():
            if key in seen or key.startswith("mtp") or key in NOT_PER_LAYER:
                continue
            entries = _entries(key, value)
            if entries is not None and len(entries) in lengths:
                seen.add(key)
                found.append((root, key))
    return found


def _node(config: Mapping[str, Any], root: str) -> Mapping[str, Any]:
    """The config's level at ``root`` (a key may hold dots: GGUF's do), empty where none."""
    node = lookup(config, root[:-1]) if root else config
    return node if isinstance(node, Mapping) else {}


def _entries(key: str, value: Any) -> list[Any] | None:
    """A per-layer value's entries (a pattern's characters up to a Megatron ``/``); None
    where ``value`` is no list of scalars."""
    if isinstance(value, str) and key.endswith(PER_LAYER_SUFFIXES):
        return list(value.split("/", 1)[0])
    if isinstance(value, list) and all(
        v is None or isinstance(v, str | int | float) for v in value
    ):
        return value
    return None


def _per_layer_lists(
    config: Mapping[str, Any], layers: int, lengths: frozenset[int]
) -> list[tuple[str, list[Any]]]:
    """(key, one entry a layer) of every per-layer fact the config lists (:func:`per_layer_keys`):
    of the layers, of the main layers where MTP layers are counted among the hidden ones
    (padded), or of the layers and the MTP layers after them (cut). Facts that do not matter
    only split kinds finer."""
    found: list[tuple[str, list[Any]]] = []
    for root, key in per_layer_keys(config, lengths):
        entries = _entries(key, _node(config, root)[key])
        assert entries is not None  # per_layer_keys took it
        found.append((key, (entries + ["mtp"] * layers)[:layers]))
    return found


def _derived_mlp(config: Mapping[str, Any], layers: int, family: MtpFamily) -> list[str] | None:
    """Dense or MoE per layer from the scalar keys that say it (DeepSeek's
    ``first_k_dense_replace`` and ``moe_layer_freq``, Qwen's ``mlp_only_layers`` and
    ``decoder_sparse_step``, Step's ``moe_layers_enum``, llama.cpp's
    ``leading_dense_block_count``, Megatron's ``moe_layer_freq`` list), with DeepSeek-V4's
    hash-routed first layers (``num_hash_layers``); None when none does."""
    freq = _value(config, "moe_layer_freq", family)
    enum = _value(config, "moe_layers_enum", family)
    first = _int(config, "first_k_dense_replace", family)
    if first is None:
        first = _int(config, "leading_dense_block_count", family)
    only = _value(config, "mlp_only_layers", family)
    step = _int(config, "decoder_sparse_step", family)
    hashed = _int(config, "num_hash_layers", family) or 0
    if isinstance(freq, list) and len(freq) == layers:
        moe = {k for k, f in enumerate(freq) if f}
    elif isinstance(enum, str) and enum.replace(",", "").strip().isdigit():
        moe = {int(k) for k in enum.split(",") if k.strip()}
    elif first is None and not isinstance(only, list) and step is None and not hashed:
        return None
    else:
        every = freq if is_int(freq) and freq > 0 else 1
        dense = set(only) if isinstance(only, list) else set()
        moe = {
            k
            for k in range(layers)
            if k >= (first or 0)
            and k % every == 0
            and k not in dense
            and (k + 1) % (step or 1) == 0
        }
    return ["hash_moe" if k < hashed else "moe" if k in moe else "dense" for k in range(layers)]


def _full_attention(config: Mapping[str, Any], layers: int, family: MtpFamily) -> list[str] | None:
    """Qwen3-Next's ``full_attention_interval`` (every n-th layer full attention, the others
    linear) where no ``layer_types`` list says which; not where the family's configs hold the
    key without meaning (llama.cpp's: its ``count.unreliable_keys``)."""
    interval = _int(config, "full_attention_interval", family)
    if not interval:
        return None
    return ["full" if (k + 1) % interval == 0 else "linear" for k in range(layers)]


def main_layout(
    family: MtpFamily, config: Mapping[str, Any], mtp_inside: int = 0, mtp: int = 0
) -> MainLayout:
    """The main model ``config`` describes, read with ``family``'s keys; ``mtp_inside``: MTP
    layers the layer count includes (Ling-V2's remote code counts them as hidden layers);
    ``mtp``: the MTP layers declared (per-layer lists may cover them too)."""
    layers = hidden_layer_count(family, config)
    experts = next((n for key in EXPERT_COUNT_KEYS if (n := _int(config, key, family))), None)
    if layers is None:
        return MainLayout(None, (), experts, None, tied_head(config))
    lengths = frozenset((layers, layers - mtp_inside, layers + mtp))
    columns = _per_layer_lists(config, layers, lengths)
    keys = {key for key, _ in columns}
    mlp = _derived_mlp(config, layers, family) if experts else None
    if mlp is not None and "mlp_layer_types" not in keys:
        columns.append(("mlp", mlp))
    attention = _full_attention(config, layers, family)
    if attention is not None and "layer_types" not in keys:
        columns.append(("attention", attention))
    kinds = tuple(tuple((key, str(entries[k])) for key, entries in columns) for k in range(layers))
    said = any(
        key in ("mlp", "mlp_layer_types", "layers_block_type") or key.endswith("_pattern")
        for key, _ in columns
    )
    moe = (
        frozenset(k for k in range(layers) if any(v in MOE_KINDS for _, v in kinds[k]))
        if said
        else None
    )
    return MainLayout(layers, kinds, experts, moe, tied_head(config))
