"""Locate a checkpoint's MTP layers from its config and tensor names (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.errors import ConfigError
from mtpcheck.families.catalog import (
    FAMILIES,
    FAMILY_BY_MODEL_TYPE,
    GENERIC_COUNT_KEYS,
    HYBRID_MTP_PATTERN,
    MEGATRON,
    MEGATRON_HYBRID,
)
from mtpcheck.families.interface import CopyPolicy, Drafter, MtpFamily
from mtpcheck.families.name_templates import (
    LayerNames,
    fill_template,
    full_matches,
    joined_names,
    prefix_runs,
    template_pattern,
)
from mtpcheck.families.quantized_parts import lacking, own_parts_lacking
from mtpcheck.model import (
    Checkpoint,
    CheckpointSummary,
    MtpLayerReport,
    TensorMeta,
    total_nbytes,
)
from mtpcheck.model.config_keys import TEXT_ROOTS, is_int, lookup, text_value
from mtpcheck.params import FUSED_EXPERTS, group, stored_forms


@dataclass(frozen=True)
class DeclaredCount:
    """The MTP layer count a config declares, and which key (if any) declared it."""

    value: int | None
    source: str
    from_key: bool


@dataclass(frozen=True)
class MtpAnalysis:
    """Where a checkpoint's MTP layers are, and which of their tensors are missing."""

    family: MtpFamily | None
    model_type: str | None
    declared: DeclaredCount
    num_hidden_layers: int | None
    layers: tuple[MtpLayerReport, ...]
    copies: tuple[tuple[str, str], ...]
    """(copy tensor, main tensor) pairs for copies present in the checkpoint."""
    reference_layers: Mapping[int, str]
    """MTP depth -> prefix of the main decoder layer its block was compared against."""
    mirrors: tuple[tuple[str, str], ...] = ()
    """(MTP block prefix, prefix of the main decoder layer it mirrors), one per block."""
    shared_missing: tuple[str, ...] = ()
    """Main tensors the MTP layers draft through (embedding, output head) that the checkpoint
    lacks; the head only where the config does not tie it to the embedding."""

    @property
    def mtp_names(self) -> frozenset[str]:
        return frozenset(n for layer in self.layers for n in layer.present)

    @property
    def complete_layers(self) -> int:
        return sum(1 for layer in self.layers if layer.complete and layer.present)

    def scope(self, tensors: Mapping[str, TensorMeta]) -> frozenset[str]:
        """MTP tensors plus the main embedding and head they share, as present."""
        shared = self.family.main_shared if self.family else _DEFAULT_SHARED
        return self.mtp_names | {n for n in shared if n in tensors}


_DEFAULT_SHARED = ("model.embed_tokens.weight", "lm_head.weight")


def _non_negative_int(value: Any) -> bool:
    return is_int(value) and value >= 0


def detect_family(config: Mapping[str, Any]) -> MtpFamily | None:
    """Pick a family by ``model_type``, then by ``architectures``; None when unknown."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILY_BY_MODEL_TYPE:
        family = FAMILY_BY_MODEL_TYPE[model_type]
        if family is MEGATRON and isinstance(config.get(HYBRID_MTP_PATTERN), str):
            return MEGATRON_HYBRID
        return family
    archs = config.get("architectures")
    if isinstance(archs, list):
        for family in FAMILIES:
            if any(a in family.architectures for a in archs):
                return family
    return None


def _count_at(
    config: Mapping[str, Any], key: str, config_path: str | None, null_is_zero: bool = False
) -> tuple[int, str] | None:
    """A non-negative integer at ``key`` (or ``text_config.key``) and where it was found.

    With ``null_is_zero`` an explicit null counts as 0: Megatron-Bridge writes
    ``mtp_num_layers: null`` when its model provider has MTP turned off, which is a
    statement about the checkpoint, not unreadable input.
    """
    found = text_value(config, key)
    if found is None:
        return None
    path, value = found
    if value is None and null_is_zero:
        return 0, f"{path}: null"
    if not _non_negative_int(value):
        raise ConfigError(
            config_path or "config.json", f"{path} is {value!r}; expected a non-negative integer"
        )
    return int(value), path


def declared_count(
    config: Mapping[str, Any], family: MtpFamily | None, config_path: str | None
) -> DeclaredCount:
    """Read the declared MTP count; a value of the wrong type is a :class:`ConfigError`."""
    keys = family.count_keys if family else GENERIC_COUNT_KEYS
    for key in keys:
        found = _count_at(config, key, config_path, null_is_zero=True)
        if found is not None:
            return DeclaredCount(found[0], found[1], True)
    if not config:
        return DeclaredCount(None, "no config.json", False)
    if family and family.default_count is not None:
        return DeclaredCount(
            family.default_count,
            f"no count key; {family.display} loaders assume {family.default_count}",
            False,
        )
    return DeclaredCount(None, f"no {' / '.join(keys[:2])} in config", False)


def _hidden_layers(
    config: Mapping[str, Any], config_path: str | None, key: str = "num_hidden_layers"
) -> int | None:
    found = _count_at(config, key, config_path)
    return found[0] if found else None


def _patterns(family: MtpFamily, config: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """The MTP per-depth pattern and the main layers' pattern (one entry a layer; empty when
    the config has none). Hub configs spell them as strings, transformers' as lists."""
    for mtp_key, main_key in family.flat_layers_keys:
        for root in TEXT_ROOTS:
            mtp = lookup(config, root + mtp_key)
            if isinstance(mtp, str | list) and mtp:
                main = lookup(config, root + main_key)
                return list(mtp), list(main) if isinstance(main, str | list) else []
    return [], []


def hidden_layer_count(family: MtpFamily, config: Mapping[str, Any]) -> int | None:
    """The main decoder layers: the family's count key, else the length of its main layers'
    pattern (Nemotron-H's ``layers_block_type``; a hybrid Megatron pattern ends at ``/``)."""
    found = _count_at(config, family.hidden_layers_key, None)
    if found:
        return found[0]
    main = _patterns(family, config)[1]
    return main.index("/") if "/" in main else (len(main) or None)


_NESTED = re.compile(r"^mtp\.layers\.0\.transformer_layer\.layers\.(\d+)\.")


def _nested_positions(tensors: Mapping[str, TensorMeta]) -> int:
    """Layers nested in Megatron's first MTP depth (megatron-core's hybrid MTP block), by
    name; 0 when the depth is one transformer layer."""
    found = {int(m.group(1)) for n in tensors if (m := _NESTED.match(n))}
    return max(found) + 1 if found else 0


def depth_span(family: MtpFamily, config: Mapping[str, Any]) -> int:
    """Flat layers one MTP depth spans (1 unless the family's MTP pattern says more)."""
    return max(1, len(_patterns(family, config)[0]))


def _first_specific_layer(
    family: MtpFamily, names: list[str], joined: str | None = None
) -> int | None:
    """The lowest absolute layer number holding an MTP-only tensor, if any."""
    joined = joined_names(names) if joined is None else joined
    found = [
        int(m.group("n"))
        for template in family.specific
        if "{n}" in template
        for _, m in full_matches(names, joined, template)
    ]
    return min(found) if found else None


def _infer_base(family: MtpFamily, names: list[str]) -> int:
    """Without num_hidden_layers, take N as the first layer holding an MTP-only tensor."""
    found = _first_specific_layer(family, names)
    if found is not None:
        return found
    main = template_pattern(family.main_layer_prefix.replace("{k}", "{n}"), prefix_only=True)
    layers = [int(m.group("n")) for n in names if (m := main.match(n))]
    return max(layers) + 1 if layers else 0


_PER_EXPERT = re.compile(r"^mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.")
PACKED_EXPERTS = tuple(FUSED_EXPERTS)
"""How transformers 5 and Qwen's BF16 releases store a layer's routed experts when packed."""


def _in_block_form(
    expected: frozenset[str], inner: set[str], main_prefix: str, tensors: Mapping[str, TensorMeta]
) -> frozenset[str]:
    """The main layer's tensor names as the MTP block stores them. Qwen3.5/3.6 releases pack
    the routed experts of one and keep one tensor per expert in the other, either way round;
    the expert count of packed main experts is their first dimension."""
    packed = set(PACKED_EXPERTS)
    per_expert = {rel for rel in expected if _PER_EXPERT.match(rel)}
    if inner & packed and per_expert and not packed <= expected:
        return frozenset((expected - per_expert) | packed)
    if packed <= expected and not inner & packed and any(map(_PER_EXPERT.match, inner)):
        meta = tensors.get(main_prefix + PACKED_EXPERTS[0])
        count = meta.shape[0] if meta is not None and meta.shape else 0
        unpacked = {
            f"mlp.experts.{e}.{proj}.weight"
            for e in range(count)
            for proj in ("gate_proj", "up_proj", "down_proj")
        }
        return frozenset((expected - packed) | unpacked)
    return expected


def _other_kind(inner: set[str], expected: frozenset[str]) -> bool:
    """Whether a block and the main layer picked for it each hold parameters the other lacks
    (stored forms aside: a BF16 block beside quantized main layers is alike): a main layer of
    another kind, picked because the block's own is gone (which the main-model check reports),
    not the block's own loss."""
    if inner <= expected or expected <= inner:
        return False  # alike as stored (most checkpoints): no grouping needed
    mine, theirs = set(group(inner)), set(group(expected))
    return not mine <= theirs and not theirs <= mine


def _pick_reference(
    main: Mapping[int, frozenset[str]], inner: set[str]
) -> tuple[int, frozenset[str]] | None:
    """The main layer sharing the most tensor names with the MTP block (latest on ties)."""
    if not main:
        return None
    # Latest first: a layer holding every name of the block cannot be beaten (DeepSeek-V3:
    # one set intersection instead of 61).
    best, shared = -1, -1
    for k in sorted(main, reverse=True):
        n = len(main[k] & inner)
        if n > shared:
            best, shared = k, n
            if n == len(inner):
                break
    return best, main[best]


def analyse(
    config: Mapping[str, Any], tensors: Mapping[str, TensorMeta], config_path: str | None = None
) -> MtpAnalysis:
    """Find the MTP layers of a checkpoint and what each one lacks."""
    family = detect_family(config)
    nested = _nested_positions(tensors) if family in (MEGATRON, MEGATRON_HYBRID) else 0
    if nested:  # a hybrid save whose config may not say so (mcore-bridge's args.json)
        family = MEGATRON_HYBRID
    declared = declared_count(config, family, config_path)
    hidden = _hidden_layers(
        config, config_path, family.hidden_layers_key if family else "num_hidden_layers"
    )
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    names = sorted(tensors)
    if family is None:
        return _analyse_unknown(model_type, declared, hidden, names, tensors)

    base = hidden if hidden is not None else _infer_base(family, names)
    joined = joined_names(names)
    early = _first_specific_layer(family, names, joined) if hidden is not None else None
    if early is not None and early < base:
        base = early  # MTP layers counted inside num_hidden_layers (Ling-V2 remote code)
    mtp_kinds, main_kinds = _patterns(family, config)
    span = max(1, len(mtp_kinds) or nested)

    def depth(groups: dict[str, str]) -> int:
        if groups.get("n") is not None:
            return int(groups["n"]) - base
        if groups.get("d") is not None:
            return int(groups["d"])
        for key in ("i", "first", "last"):
            if groups.get(key) is not None:
                return int(groups[key]) // span
        return 0

    members: dict[int, set[str]] = {}
    for start, stop, _, groups in prefix_runs(names, family.layer_prefix):
        if (i := depth(groups)) >= 0:
            members.setdefault(i, set()).update(names[start:stop])
    for template in (*family.specific, *(c.template for c in family.copies)):
        under = template.startswith(family.layer_prefix)
        if under and "{" not in template[len(family.layer_prefix) :]:
            # every name it matches was matched above by the prefix, with the same depth
            continue
        # outside the layer prefix, a quantized tensor's parts are found by their own names
        for form in (template,) if under else stored_forms(template):
            for name, m in full_matches(names, joined, form):
                if (i := depth(m.groupdict())) >= 0:
                    members.setdefault(i, set()).add(name)

    main = LayerNames(names, family.main_layer_prefix.replace("{k}", "{n}"), base)
    wanted = set(members) | set(range(declared.value or 0))
    copy_names = {
        i: {f for c in family.copies for f in stored_forms(fill_template(c.template, i, base))}
        for i in wanted
    }
    own = {
        i: {fill_template(t, i, base, span) for t in family.specific if i == 0 or "{" in t}
        for i in wanted
    }

    def inner_of(i: int, flat: int) -> tuple[str, set[str]]:
        prefix = fill_template(family.layer_prefix, flat, base, span)
        rest = members.get(i, set()) - own[i] - copy_names[i]
        return prefix, {n[len(prefix) :] for n in rest if n.startswith(prefix)}

    def candidates(flat: int) -> Mapping[int, frozenset[str]]:
        """Main layers a flat MTP layer can mirror: those of its pattern entry, if known."""
        if not mtp_kinds or not main_kinds:
            return main
        kind = mtp_kinds[flat % span]
        return {k: v for k, v in main.items() if k < len(main_kinds) and main_kinds[k] == kind}

    # A block that is wholly gone mirrors what its siblings at the same position mirror.
    sibling: dict[int, int] = {}
    for i in sorted(wanted):
        for flat in range(i * span, (i + 1) * span):
            inner = inner_of(i, flat)[1]
            if inner and flat % span not in sibling:
                if (picked := _pick_reference(candidates(flat), inner)) is not None:
                    sibling[flat % span] = picked[0]

    layers = []
    references: dict[int, str] = {}
    mirrors: list[tuple[str, str]] = []
    copies: list[tuple[str, str]] = []
    for i in sorted(wanted):
        present = members.get(i, set())
        missing = {n for n in own[i] - present if not present.intersection(stored_forms(n))}
        for copy in family.copies:
            name = fill_template(copy.template, i, base)
            if name in present or present.intersection(stored_forms(name)):
                copies.append((name, copy.main))  # quantized copies too, by their parameter
            elif family.copy_policy is CopyPolicy.REQUIRED:
                missing.add(name)
        matched: list[str] = []
        reference: tuple[str, frozenset[str]] | None = None
        for flat in range(i * span, (i + 1) * span):
            prefix, inner = inner_of(i, flat)
            if not family.inner_mirrors_main:
                continue
            pool = candidates(flat)
            k = sibling.get(flat % span) if not inner else None
            picked = (k, pool[k]) if k in pool else _pick_reference(pool, inner)
            if picked is None:
                continue
            main_prefix = family.main_layer_prefix.replace("{k}", str(picked[0]))
            expected = _in_block_form(picked[1], inner, main_prefix, tensors)
            own_forms = {f for n in own[i] for f in stored_forms(n)}
            if _other_kind({r for r in inner if prefix + r not in own_forms}, expected):
                continue
            matched.append(main_prefix)
            mirrors.append((prefix, main_prefix))
            missing |= lacking(family, expected - inner, expected, prefix, inner, tensors)
            reference = (main_prefix, picked[1])
        if reference is not None:
            mtp_only = own[i] | {fill_template(c.template, i, base) for c in family.copies}
            missing |= own_parts_lacking(mtp_only, present, *reference, tensors)
        if matched:
            references[i] = "*, ".join(matched)
        first = fill_template(family.layer_prefix, i * span, base, span)
        layers.append(_layer_report(i, first, present, missing, tensors))
    return MtpAnalysis(
        family=family,
        model_type=model_type,
        declared=declared,
        num_hidden_layers=hidden,
        layers=tuple(layers),
        copies=tuple(copies),
        reference_layers=references,
        mirrors=tuple(mirrors),
        shared_missing=_shared_missing(family, config, tensors) if layers else (),
    )


def tied_head(config: Mapping[str, Any]) -> bool:
    """Whether the output head is the embedding (HF ``tie_word_embeddings``, Megatron-LM's
    ``untie_embeddings_and_output_weights`` false)."""
    if text_value(config, "tie_word_embeddings", lambda v: v is True):
        return True
    return lookup(config, "untie_embeddings_and_output_weights") is False


def _shared_missing(
    family: MtpFamily, config: Mapping[str, Any], tensors: Mapping[str, TensorMeta]
) -> tuple[str, ...]:
    if family.drafter is not Drafter.INSIDE:
        return ()
    needed = family.main_shared[:1] if tied_head(config) else family.main_shared
    return tuple(n for n in needed if n not in tensors)


def _layer_report(
    i: int, prefix: str, present: set[str], missing: set[str], tensors: Mapping[str, TensorMeta]
) -> MtpLayerReport:
    metas = [tensors[n] for n in present]
    return MtpLayerReport(
        index=i,
        prefix=prefix,
        present=tuple(sorted(present)),
        missing=tuple(sorted(missing)),
        nbytes=sum(m.nbytes for m in metas),
        dtypes=tuple(sorted({m.dtype for m in metas})),
        unreadable=tuple(sorted(m.name for m in metas if not m.readable)),
    )


_LAYER_NAME = re.compile(r"^(?:model\.)?(?:language_model\.)?layers\.(\d+)\.")
_MTP_WORDS = ("mtp", "nextn", "eh_proj")


def _analyse_unknown(
    model_type: str | None,
    declared: DeclaredCount,
    hidden: int | None,
    names: list[str],
    tensors: Mapping[str, TensorMeta],
) -> MtpAnalysis:
    """Name heuristics: layers numbered at or past num_hidden_layers, or names saying mtp."""
    members: dict[int, set[str]] = {}
    for name in names:
        m = _LAYER_NAME.match(name)
        if m and hidden is not None and int(m.group(1)) >= hidden:
            members.setdefault(int(m.group(1)) - hidden, set()).add(name)
            continue
        parts = name.split(".")
        hits = [j for j, p in enumerate(parts) if any(w in p for w in _MTP_WORDS)]
        if not hits:
            continue
        index = next((int(p) for p in parts[hits[0] + 1 :] if p.isdigit()), 0)
        members.setdefault(index, set()).add(name)
    layers = tuple(_layer_report(i, "", members[i], set(), tensors) for i in sorted(members))
    return MtpAnalysis(
        family=None,
        model_type=model_type,
        declared=declared,
        num_hidden_layers=hidden,
        layers=layers,
        copies=(),
        reference_layers={},
    )


def summarise(ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckpointSummary:
    """What a report says about one input checkpoint."""
    family = analysis.family
    return CheckpointSummary(
        path=ckpt.path,
        format=ckpt.format,
        family=family.key if family else None,
        family_display=family.display if family else "unknown",
        model_type=analysis.model_type,
        declared_mtp=analysis.declared.value,
        declared_by=analysis.declared.source,
        num_hidden_layers=analysis.num_hidden_layers,
        tensor_count=len(ckpt.tensors),
        total_bytes=total_nbytes(ckpt.tensors),
        mtp_layers=analysis.layers,
    )
