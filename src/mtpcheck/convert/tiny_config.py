"""Scale a real ``config.json`` down to a tiny model of the same structure (``--synthetic``).

What stays: the family, the MTP depth and everything that says how the MTP layers are laid
out, the storage dtype, and one main decoder layer of every kind the config has (a kind is
every per-layer fact the config states, :func:`mtpcheck.families.main_layout.main_layout`).
What shrinks: every width, head count, expert count and the vocabulary (:data:`TINY_DIMS`, at
the top level and in the language model's nested config), the token ids with the vocabulary,
and a vision tower to one block. Every per-layer list and pattern is cut to the layers kept
(its MTP entries stay), and the keys that say which layers are dense, MoE or hash-routed are
renumbered for them. A quantization block is dropped (the tiny checkpoint is stored
unquantized) and said in :attr:`TinyConfig.notes`.

Pure: a dict in, a dict out; nothing here imports torch or transformers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from mtpcheck.errors import ConfigError, ConfigKeyError
from mtpcheck.families import MtpFamily, declared_count
from mtpcheck.families.main_layout import main_layout, per_layer_keys
from mtpcheck.model.config_keys import TEXT_ROOTS, is_int, lookup

TINY_DIMS: Mapping[str, int] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "moe_intermediate_size": 8,
    "shared_expert_intermediate_size": 8,
    "moe_shared_expert_intermediate_size": 8,
    "share_expert_dim": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_attention_groups": 1,
    "head_dim": 8,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "max_seq_len": 64,
    "sliding_window": 8,
    "q_lora_rank": 12,
    "kv_lora_rank": 8,
    "o_lora_rank": 8,
    "o_groups": 1,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_local_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_top_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "linear_conv_kernel_dim": 2,
    "linear_key_head_dim": 4,
    "linear_value_head_dim": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "index_topk": 8,
    "index_head_dim": 8,
    "index_n_heads": 2,
    "mamba_num_heads": 4,
    "mamba_head_dim": 8,
    "n_groups": 1,
    "ssm_state_size": 8,
    "chunk_size": 8,
    "moe_latent_size": 8,
}
"""The tiny value of each width a language model's config may state; a key the config states
as a positive integer takes it (a null or a 0, such as an absent q LoRA, stays)."""

VISION_DIMS: Mapping[str, int] = {
    "depth": 1,
    "num_hidden_layers": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "num_attention_heads": 2,
    "num_position_embeddings": 16,
    "patch_size": 2,
}
"""A vision tower's widths, scaled down alike (its output width follows the language model)."""

LANGUAGE_CONFIGS = ("text_config", "language_config", "llm_config")
"""Keys under which a vision-language config nests its language model's config."""
VISION_CONFIGS = ("vision_config",)
"""Keys under which a vision-language config nests its vision tower's config."""
DROPPED = ("quantization_config", "auto_map")
"""Keys the tiny model leaves out: it is stored unquantized, and built without remote code."""
_DERIVED_LISTS = ("layer_types", "mlp_layer_types")
"""Per-layer lists transformers derives from the scalar keys when the config has none."""
_TOKEN_ID = re.compile(r"(?:^|_)token_(?:id|ids|index)$")


@dataclass(frozen=True)
class TinyConfig:
    """A real config scaled down, and what was changed beyond the scaling."""

    config: dict[str, Any]
    kept_layers: tuple[int, ...]
    """The real model's main decoder layers the tiny one keeps, in order (one of each kind)."""
    notes: tuple[str, ...]
    """What the tiny checkpoint leaves out that the real one has, in words."""


def scale_down(config: Mapping[str, Any], family: MtpFamily, where: str) -> TinyConfig:
    """``config`` (the real one, of ``family``) scaled down; ``where`` names the file in a
    :class:`~mtpcheck.errors.ConfigKeyError` for a key the scaling needs and does not find."""
    mtp = declared_count(config, family, where).value or 0
    layout = main_layout(family, config, mtp=mtp)
    if layout.layers is None:
        raise ConfigKeyError(
            family.count.hidden_layers_key, "a scaled-down model (how many layers to cut)", where
        )
    first_of: dict[Any, int] = {}
    for k, kind in enumerate(layout.kinds or ((),) * layout.layers):
        first_of.setdefault(kind, k)
    kept = tuple(sorted(first_of.values()))
    tiny = _without(config, DROPPED)
    notes = tuple(_dropped_notes(config))
    _cut_layers(tiny, config, layout.layers, mtp, kept)
    _renumber(tiny, kept, layout.layers, layout.moe_layers, where)
    if layout.kinds and any(key == "attention" for key, _ in layout.kinds[0]):
        _attention_interval(tiny, layout.kinds, kept)
    for root in (None, *LANGUAGE_CONFIGS):
        node = tiny if root is None else tiny.get(root)
        if isinstance(node, dict):
            _scale_language(node)
    for key in VISION_CONFIGS:
        if isinstance(tiny.get(key), dict):
            tiny[key] = _scale_vision(tiny[key], _text_hidden(tiny))
            notes += (f"{key} scaled down to one {VISION_DIMS['hidden_size']}-wide block",)
    _remap_token_ids(tiny, _vocab(tiny), where)
    return TinyConfig(tiny, kept, notes)


def _without(config: Mapping[str, Any], dropped: tuple[str, ...]) -> dict[str, Any]:
    """A deep copy of ``config`` without the ``dropped`` keys at any nesting level."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in dropped:
            continue
        out[key] = _without(value, dropped) if isinstance(value, Mapping) else _copy(value)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_without(v, ()) if isinstance(v, Mapping) else _copy(v) for v in value]
    return value


def _dropped_notes(config: Mapping[str, Any]) -> list[str]:
    notes = []
    for root in ("", *(f"{k}." for k in LANGUAGE_CONFIGS)):
        block = lookup(config, root + "quantization_config")
        if isinstance(block, Mapping):
            method = block.get("quant_method") or block.get("format") or "a quantization"
            notes.append(
                f"{root}quantization_config ({method}) left out: the synthetic checkpoint is "
                "stored unquantized, in the config's dtype"
            )
    return notes


# --- the layers kept -------------------------------------------------------------------------


def _cut_layers(
    tiny: dict[str, Any], real: Mapping[str, Any], layers: int, mtp: int, kept: tuple[int, ...]
) -> None:
    """Every per-layer list and pattern cut to ``kept`` (entries past the main layers, the MTP
    layers', kept), and the layer count with them."""
    for root, key in per_layer_keys(real, frozenset((layers, layers + mtp))):
        node = _node(tiny, root)
        node[key] = _cut(node[key], layers, kept)
    for root in TEXT_ROOTS:
        node = _node(tiny, root)
        if is_int(node.get("num_hidden_layers")):
            node["num_hidden_layers"] = len(kept)


def _node(config: dict[str, Any], root: str) -> dict[str, Any]:
    node = config if not root else config.get(root[:-1])
    return node if isinstance(node, dict) else {}


def _cut(value: Any, layers: int, kept: tuple[int, ...]) -> Any:
    if isinstance(value, str):
        main, slash, rest = value.partition("/")
        return "".join(main[k] for k in kept) + main[layers:] + slash + rest
    return [value[k] for k in kept] + list(value[layers:])


def _renumber(
    tiny: dict[str, Any],
    kept: tuple[int, ...],
    layers: int,
    moe: frozenset[int] | None,
    where: str,
) -> None:
    """The scalar keys that number layers (the dense first layers, the hash-routed first
    layers, the MoE layers' list, the dense-only layers) renumbered for the layers kept."""

    def new_index(k: int) -> int | None:
        if k >= layers:  # an MTP layer: after the kept main layers, as after the real ones
            return len(kept) + k - layers
        return kept.index(k) if k in kept else None

    for root in TEXT_ROOTS:
        node = _node(tiny, root)
        for key in ("first_k_dense_replace", "leading_dense_block_count", "num_hash_layers"):
            if is_int(node.get(key)):
                node[key] = sum(1 for k in kept if k < node[key])
        if isinstance(node.get("moe_layers_enum"), str):
            found = [new_index(int(k)) for k in node["moe_layers_enum"].split(",") if k.strip()]
            node["moe_layers_enum"] = ",".join(str(k) for k in found if k is not None)
        if isinstance(node.get("mlp_only_layers"), list):
            found = [new_index(int(k)) for k in node["mlp_only_layers"] if is_int(k)]
            node["mlp_only_layers"] = [k for k in found if k is not None]
        step = node.get("decoder_sparse_step")
        if is_int(step) and step > 1 and moe is not None:  # every n-th layer MoE: said per layer
            node["decoder_sparse_step"] = 1
            node["mlp_only_layers"] = [j for j, k in enumerate(kept) if k not in moe]
        freq = node.get("moe_layer_freq")
        if isinstance(freq, int) and freq > 1:
            raise ConfigError(
                where,
                f"{root}moe_layer_freq is {freq}: every {freq}-th layer MoE cannot be kept for "
                f"the layers a scaled-down model keeps ({list(kept)}); a list says it per layer",
            )


def _attention_interval(
    tiny: dict[str, Any], kinds: tuple[tuple[tuple[str, str], ...], ...], kept: tuple[int, ...]
) -> None:
    """Layer kinds a config derives from ``full_attention_interval`` (every n-th layer full
    attention) kept that way for the layers kept: the interval that gives them, else (no
    interval does) written out as ``layer_types``."""
    full = [dict(kinds[k])["attention"] == "full" for k in kept]
    for root in TEXT_ROOTS:
        node = _node(tiny, root)
        if not is_int(node.get("full_attention_interval")) or "layer_types" in node:
            continue
        for n in range(1, len(kept) + 1):
            if full == [(j + 1) % n == 0 for j in range(len(kept))]:
                node["full_attention_interval"] = n
                return
        words = {True: "full_attention", False: "linear_attention"}
        node["layer_types"] = [words[f] for f in full]
        return


# --- the widths ------------------------------------------------------------------------------


def _scale_language(node: dict[str, Any]) -> None:
    """A language model's widths scaled down in place, kept consistent with each other."""
    head_dim, rotary = node.get("head_dim"), node.get("rotary_dim")
    for key, value in TINY_DIMS.items():
        if _positive(node.get(key)):
            node[key] = value
    if "num_attention_heads" in node and "num_key_value_heads" not in node:
        node["num_key_value_heads"] = node["num_attention_heads"]
    nope, rope = node.get("qk_nope_head_dim"), node.get("qk_rope_head_dim")
    if _positive(node.get("kv_lora_rank")) and _positive(rope):  # MLA: head_dim is the rope
        if "head_dim" in node:  # part, qk the whole
            node["head_dim"] = rope
        if _positive(node.get("qk_head_dim")) and _positive(nope):
            node["qk_head_dim"] = nope + rope
    if _positive(rotary) and _positive(head_dim):  # the rotated part, as a share of a head
        node["rotary_dim"] = max(2, TINY_DIMS["head_dim"] * rotary // head_dim // 2 * 2)
    nested = node.get("attention_other_setting")
    if isinstance(nested, dict):
        _scale_language(nested)
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(node.get(key), dict):
            _scale_mrope(node[key], node)


def _scale_mrope(rope: dict[str, Any], node: Mapping[str, Any]) -> None:
    """Multimodal rope sections (per axis, in rotary frequency pairs) scaled to the tiny
    head: their sum is half the rotated width, spread as evenly as the width allows."""
    sections = rope.get("mrope_section")
    if not isinstance(sections, list) or not sections:
        return
    share = rope.get("partial_rotary_factor", node.get("partial_rotary_factor", 1.0))
    pairs = max(1, int(TINY_DIMS["head_dim"] * float(share)) // 2)
    base, extra = divmod(pairs, len(sections))
    rope["mrope_section"] = [base + (1 if i < extra else 0) for i in range(len(sections))]


def _scale_vision(vision: Mapping[str, Any], text_hidden: int) -> dict[str, Any]:
    out = dict(vision)
    for key, value in VISION_DIMS.items():
        if _positive(out.get(key)):
            out[key] = value
    if _positive(out.get("out_hidden_size")):
        out["out_hidden_size"] = text_hidden
    indexes = out.get("deepstack_visual_indexes")
    if isinstance(indexes, list):
        out["deepstack_visual_indexes"] = [i for i in indexes if is_int(i) and i < 1]
    return out


def _positive(value: Any) -> TypeGuard[int]:
    return is_int(value) and value > 0


def language(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's level of a config: its nested ``text_config`` (or kin), else the
    config itself."""
    for key in LANGUAGE_CONFIGS:
        if isinstance(config.get(key), Mapping):
            return config[key]  # type: ignore[no-any-return]
    return config


def _text_hidden(config: Mapping[str, Any]) -> int:
    hidden = language(config).get("hidden_size", config.get("hidden_size"))
    return int(hidden) if _positive(hidden) else TINY_DIMS["hidden_size"]


def _vocab(config: Mapping[str, Any]) -> int:
    vocab = language(config).get("vocab_size", config.get("vocab_size"))
    return int(vocab) if _positive(vocab) else TINY_DIMS["vocab_size"]


# --- the token ids ---------------------------------------------------------------------------


def _remap_token_ids(config: dict[str, Any], vocab: int, where: str) -> None:
    """Every token id past the tiny vocabulary (pad, bos, eos, image tokens, at any level)
    moved inside it: distinct ids stay distinct, counted down from the last one."""
    found: set[int] = set()

    def note(i: int) -> int:
        found.add(i)
        return i

    _walk_token_ids(config, note)
    beyond = sorted(i for i in found if i >= vocab)
    if len(beyond) > vocab // 2:
        raise ConfigError(
            where, f"{len(beyond)} distinct token ids do not fit a {vocab}-token vocabulary"
        )
    moved = {old: vocab - 1 - n for n, old in enumerate(beyond)}
    _walk_token_ids(config, lambda i: moved.get(i, i))


def _walk_token_ids(node: Any, change: Callable[[int], int]) -> None:
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if isinstance(value, dict):
            _walk_token_ids(value, change)
        elif _TOKEN_ID.search(key):
            if is_int(value):
                node[key] = change(value)
            elif isinstance(value, list):
                node[key] = [change(v) if is_int(v) else v for v in value]
