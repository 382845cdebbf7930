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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtpcheck.families.interface import MtpFamily
from mtpcheck.families.layout import hidden_layer_count
from mtpcheck.model.config_keys import TEXT_ROOTS, is_int, lookup, text_value

PER_LAYER_SUFFIXES = ("_types", "layers_block_type", "_pattern")
"""Config keys that list one entry per decoder layer end so (``layer_types``,
``mlp_layer_types``, ``indexer_types``, Nemotron-H's ``layers_block_type``, Megatron's
``hybrid_override_pattern``); keys of the MTP block (``mtp_*``) describe other layers."""

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
        """Layer ``k``'s kind for a message (``full_attention, sparse``)."""
        return ", ".join(value for _, value in self.kinds[k]) if self.kinds else ""


def _value(config: Mapping[str, Any], key: str, family: MtpFamily) -> Any:
    """``key`` at the top level, under ``text_config``, or (GGUF) under the architecture."""
    found = text_value(config, key)
    if found is not None:
        return found[1]
    arch = config.get("architecture") if family.key == "gguf" else None
    return config.get(f"{arch}.{key}") if isinstance(arch, str) else None


def _int(config: Mapping[str, Any], key: str, family: MtpFamily) -> int | None:
    value = _value(config, key, family)
    return int(value) if is_int(value) and value >= 0 else None


def _per_layer_lists(
    config: Mapping[str, Any], layers: int, main: int
) -> list[tuple[str, Sequence[Any]]]:
    """(key, entries) of each per-layer list of ``layers`` entries, or of ``main`` (the main
    layers, where MTP layers are counted among the hidden ones); a shorter list is padded."""
    found: list[tuple[str, Sequence[Any]]] = []
    seen: set[str] = set()
    for root in TEXT_ROOTS:
        node = lookup(config, root[:-1]) if root else config
        if not isinstance(node, Mapping):
            continue
        for key, value in node.items():
            if key in seen or key.startswith("mtp") or not key.endswith(PER_LAYER_SUFFIXES):
                continue
            if isinstance(value, str) and "/" in value:
                value = value.split("/", 1)[0]  # Megatron: main pattern, '/', MTP pattern
            if isinstance(value, str | list) and len(value) in (layers, main):
                seen.add(key)
                found.append((key, list(value) + ["mtp"] * (layers - len(value))))
    return found


def _derived_mlp(config: Mapping[str, Any], layers: int, family: MtpFamily) -> list[str] | None:
    """Dense or MoE per layer from the scalar keys that say it (DeepSeek's
    ``first_k_dense_replace`` and ``moe_layer_freq``, Qwen's ``mlp_only_layers`` and
    ``decoder_sparse_step``, llama.cpp's ``leading_dense_block_count``, Megatron's
    ``moe_layer_freq`` list); None when none does."""
    freq = _value(config, "moe_layer_freq", family)
    if isinstance(freq, list) and len(freq) == layers:
        return ["moe" if f else "dense" for f in freq]
    first = _int(config, "first_k_dense_replace", family)
    if first is None:
        first = _int(config, "leading_dense_block_count", family)
    only = _value(config, "mlp_only_layers", family)
    step = _int(config, "decoder_sparse_step", family)
    if first is None and not isinstance(only, list) and step is None:
        return None
    every = freq if is_int(freq) and freq > 0 else 1
    dense = set(only) if isinstance(only, list) else set()
    return [
        "moe"
        if k >= (first or 0) and k % every == 0 and k not in dense and (k + 1) % (step or 1) == 0
        else "dense"
        for k in range(layers)
    ]


def tied(config: Mapping[str, Any]) -> bool:
    """Whether the output head is the embedding (HF ``tie_word_embeddings``, Megatron-LM's
    ``untie_embeddings_and_output_weights`` false)."""
    if text_value(config, "tie_word_embeddings", lambda v: v is True):
        return True
    return lookup(config, "untie_embeddings_and_output_weights") is False


def main_layout(family: MtpFamily, config: Mapping[str, Any], mtp_inside: int = 0) -> MainLayout:
    """The main model ``config`` describes, read with ``family``'s keys; ``mtp_inside``: MTP
    layers the layer count includes (Ling-V2's remote code counts them as hidden layers)."""
    layers = hidden_layer_count(family, config)
    experts = next((n for key in EXPERT_COUNT_KEYS if (n := _int(config, key, family))), None)
    if layers is None:
        return MainLayout(None, (), experts, None, tied(config))
    columns = _per_layer_lists(config, layers, layers - mtp_inside)
    keys = {key for key, _ in columns}
    mlp = _derived_mlp(config, layers, family)
    if mlp is not None and "mlp_layer_types" not in keys:
        columns.append(("mlp", mlp))
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
    return MainLayout(layers, kinds, experts, moe, tied(config))
