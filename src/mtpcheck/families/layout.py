"""Locate a checkpoint's MTP layers from its config and tensor names (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.errors import ConfigError
from mtpcheck.families.block_mirrors import in_block_form, other_kind, pick_reference
from mtpcheck.families.catalog import (
    FAMILIES,
    FAMILY_BY_MODEL_TYPE,
    FAMILY_BY_NAME,
    GENERIC_COUNT_KEYS,
)
from mtpcheck.families.interface import CopyPolicy, Drafter, MtpFamily
from mtpcheck.families.name_templates import (
    LayerNames,
    NameTemplate,
    depth_of,
    full_matches,
    joined_names,
    prefix_runs,
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
from mtpcheck.params import stored_forms


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
        """Every MTP tensor the checkpoint holds, over all depths."""
        return frozenset(n for layer in self.layers for n in layer.present)

    @property
    def complete_layers(self) -> int:
        """MTP depths that hold tensors and lack none."""
        return sum(1 for layer in self.layers if layer.complete and layer.present)

    def scope(self, tensors: Mapping[str, TensorMeta]) -> frozenset[str]:
        """MTP tensors plus the main embedding and head they share, as present (with their
        side parts where they are stored quantized)."""
        shared = self.family.layout.main_shared if self.family else _DEFAULT_SHARED
        return self.mtp_names | {f for n in shared for f in stored_forms(n) if f in tensors}


_DEFAULT_SHARED = ("model.embed_tokens.weight", "lm_head.weight")


def _non_negative_int(value: Any) -> bool:
    return is_int(value) and value >= 0


def detect_family(config: Mapping[str, Any]) -> MtpFamily | None:
    """Pick a family by ``model_type``, then by ``architectures``; None when unknown."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in FAMILY_BY_MODEL_TYPE:
        family = FAMILY_BY_MODEL_TYPE[model_type]
        nested = FAMILY_BY_NAME.get(family.nested_as)
        if nested is not None and any(
            isinstance(config.get(key), str) for key, _ in nested.layout.flat_layers_keys
        ):
            return nested
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
    keys = family.count.keys if family else GENERIC_COUNT_KEYS
    for key in keys:
        found = _count_at(config, key, config_path, null_is_zero=True)
        if found is not None:
            return DeclaredCount(found[0], found[1], True)
    if not config:
        return DeclaredCount(None, "no config.json", False)
    if family and family.count.default is not None:
        return DeclaredCount(
            family.count.default,
            f"no count key; {family.display} loaders assume {family.count.default}",
            False,
        )
    return DeclaredCount(None, f"no {' / '.join(keys[:2])} in config", False)


def _hidden_layers(
    config: Mapping[str, Any], config_path: str | None, key: str = "num_hidden_layers"
) -> int | None:
    found = _count_at(config, key, config_path)
    return found[0] if found else None


def flat_patterns(family: MtpFamily, config: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """The MTP per-depth pattern and the main layers' pattern (one entry a layer; empty when
    the config has none). Hub configs spell them as strings, transformers' as lists."""
    for mtp_key, main_key in family.layout.flat_layers_keys:
        for root in TEXT_ROOTS:
            mtp = lookup(config, root + mtp_key)
            if isinstance(mtp, str | list) and mtp:
                main = lookup(config, root + main_key)
                return list(mtp), list(main) if isinstance(main, str | list) else []
    return [], []


def hidden_layer_count(family: MtpFamily, config: Mapping[str, Any]) -> int | None:
    """The main decoder layers: the family's count key, else the length of its main layers'
    pattern (Nemotron-H's ``layers_block_type``; a hybrid Megatron pattern ends at ``/``)."""
    found = _count_at(config, family.count.hidden_layers_key, None)
    if found:
        return found[0]
    main = flat_patterns(family, config)[1]
    return main.index("/") if "/" in main else (len(main) or None)


_NESTED = re.compile(r"^mtp\.layers\.0\.transformer_layer\.layers\.(\d+)\.")


def _nested_positions(tensors: Mapping[str, TensorMeta]) -> int:
    """Layers nested in Megatron's first MTP depth (megatron-core's hybrid MTP block), by
    name; 0 when the depth is one transformer layer."""
    found = {int(m.group(1)) for n in tensors if (m := _NESTED.match(n))}
    return max(found) + 1 if found else 0


def depth_span(family: MtpFamily, config: Mapping[str, Any]) -> int:
    """Flat layers one MTP depth spans (1 unless the family's MTP pattern says more)."""
    return max(1, len(flat_patterns(family, config)[0]))


def _first_specific_layer(
    family: MtpFamily, names: list[str], joined: str | None = None
) -> int | None:
    """The lowest absolute layer number holding an MTP-only tensor, if any."""
    joined = joined_names(names) if joined is None else joined
    found = [
        int(m.group("n"))
        for template in family.layout.specific
        if NameTemplate(template).holds("n")
        for _, m in full_matches(names, joined, template)
    ]
    return min(found) if found else None


def _infer_base(family: MtpFamily, names: list[str]) -> int:
    """Without num_hidden_layers, take N as the first layer holding an MTP-only tensor."""
    found = _first_specific_layer(family, names)
    if found is not None:
        return found
    main = NameTemplate(family.layout.main_layer_prefix)
    layers = [hit[0]["k"] for n in names if (hit := main.match_prefix(n))]
    return max(layers) + 1 if layers else 0


def _mtp_base(family: MtpFamily, names: list[str], joined: str | None, hidden: int | None) -> int:
    """The absolute layer number of MTP depth 0 (``{n}`` of depth ``i`` is ``base + i``):
    num_hidden_layers, else inferred from the names; lower where MTP-only tensors sit inside
    the main layers' numbering (Ling-V2's remote code counts its MTP layers as hidden)."""
    base = hidden if hidden is not None else _infer_base(family, names)
    early = _first_specific_layer(family, names, joined) if hidden is not None else None
    return early if early is not None and early < base else base


def _depth_members(
    family: MtpFamily, names: list[str], joined: str | None, base: int, span: int
) -> dict[int, set[str]]:
    """MTP depth -> the checkpoint's names that belong to it: under its layer prefix, or one
    of its MTP-only tensors or copies (in any stored form, where outside the prefix)."""
    members: dict[int, set[str]] = {}
    for start, stop, _, groups in prefix_runs(names, family.layout.layer_prefix):
        if (i := depth_of(groups, base, span)) >= 0:
            members.setdefault(i, set()).update(names[start:stop])
    for template in (*family.layout.specific, *(c.template for c in family.layout.copies)):
        under = template.startswith(family.layout.layer_prefix)
        if under and "{" not in template[len(family.layout.layer_prefix) :]:
            # every name it matches was matched above by the prefix, with the same depth
            continue
        # outside the layer prefix, a quantized tensor's parts are found by their own names
        for form in (template,) if under else stored_forms(template):
            for name, m in full_matches(names, joined, form):
                if (i := depth_of(m.groupdict(), base, span)) >= 0:
                    members.setdefault(i, set()).add(name)
    return members


@dataclass(frozen=True)
class _Depths:
    """What the questions asked of each MTP depth of a known family share."""

    family: MtpFamily
    tensors: Mapping[str, TensorMeta]
    base: int
    """Absolute layer number of depth 0."""
    span: int
    """Flat layers one depth spans."""
    mtp_kinds: list[Any]
    """The MTP pattern's kind per flat position (empty when the config has none)."""
    main_kinds: list[Any]
    """The main layers' pattern's kind per layer (empty when the config has none)."""
    members: Mapping[int, set[str]]
    """Depth -> its names in the checkpoint."""
    main: Mapping[int, frozenset[str]]
    """Main layer -> its tensor names relative to its prefix."""
    own: Mapping[int, set[str]]
    """Depth -> its MTP-only tensor names."""
    copy_names: Mapping[int, set[str]]
    """Depth -> its copies' names, every stored form."""

    def fill(self, template: str, i: int, span: int = 1) -> str:
        """``template`` filled for depth (or flat layer) ``i`` of this checkpoint."""
        return NameTemplate(template).fill(i, self.base, span)

    def flat_layers(self, i: int) -> range:
        """The flat layers of depth ``i``."""
        return range(i * self.span, (i + 1) * self.span)

    def inner(self, i: int, flat: int) -> tuple[str, set[str]]:
        """Flat layer ``flat``'s prefix and its names relative to it, MTP-only tensors and
        copies left out: the block that mirrors a main decoder layer."""
        prefix = self.fill(self.family.layout.layer_prefix, flat, self.span)
        rest = self.members.get(i, set()) - self.own[i] - self.copy_names[i]
        return prefix, {n[len(prefix) :] for n in rest if n.startswith(prefix)}

    def candidates(self, flat: int) -> Mapping[int, frozenset[str]]:
        """Main layers a flat MTP layer can mirror: those of its pattern entry, if known."""
        if not self.mtp_kinds or not self.main_kinds:
            return self.main
        kind = self.mtp_kinds[flat % self.span]
        return {
            k: v
            for k, v in self.main.items()
            if k < len(self.main_kinds) and self.main_kinds[k] == kind
        }


def _depths(
    family: MtpFamily,
    config: Mapping[str, Any],
    tensors: Mapping[str, TensorMeta],
    names: list[str],
    joined: str | None,
    base: int,
    nested: int,
    declared: DeclaredCount,
) -> tuple[_Depths, list[int]]:
    """The shared facts of a family checkpoint's MTP depths, and the depths to report: those
    holding a name and those the config declares."""
    mtp_kinds, main_kinds = flat_patterns(family, config)
    span = max(1, len(mtp_kinds) or nested)
    members = _depth_members(family, names, joined, base, span)
    wanted = sorted(set(members) | set(range(declared.value or 0)))
    copies = [NameTemplate(c.template) for c in family.layout.copies]
    specific = [NameTemplate(t) for t in family.layout.specific]
    depths = _Depths(
        family=family,
        tensors=tensors,
        base=base,
        span=span,
        mtp_kinds=mtp_kinds,
        main_kinds=main_kinds,
        members=members,
        main=LayerNames(names, family.layout.main_layer_prefix, base),
        own={i: {t.fill(i, base, span) for t in specific if i == 0 or not t.fixed} for i in wanted},
        copy_names={i: {f for c in copies for f in stored_forms(c.fill(i, base))} for i in wanted},
    )
    return depths, wanted


def _siblings(d: _Depths, wanted: list[int]) -> dict[int, int]:
    """Flat position -> the main layer its first block holding tensors mirrors: a block that is
    wholly gone mirrors what its siblings at the same position mirror."""
    sibling: dict[int, int] = {}
    for i in wanted:
        for flat in d.flat_layers(i):
            inner = d.inner(i, flat)[1]
            if inner and flat % d.span not in sibling:
                if (picked := pick_reference(d.candidates(flat), inner)) is not None:
                    sibling[flat % d.span] = picked[0]
    return sibling


def _copies(d: _Depths, i: int, present: set[str]) -> tuple[list[tuple[str, str]], set[str]]:
    """Depth ``i``'s copies of main tensors present (quantized ones too, by their parameter),
    as (copy, main) pairs, and those missing where the family requires them."""
    found: list[tuple[str, str]] = []
    missing: set[str] = set()
    for copy in d.family.layout.copies:
        name = d.fill(copy.template, i)
        if name in present or present.intersection(stored_forms(name)):
            found.append((name, copy.main))
        elif d.family.layout.copy_policy is CopyPolicy.REQUIRED:
            missing.add(name)
    return found, missing


@dataclass(frozen=True)
class _Mirroring:
    """How depth ``i``'s blocks compare with the main layers they mirror."""

    mirrors: list[tuple[str, str]]
    """(block prefix, main layer prefix), one per block compared."""
    missing: set[str]
    """Names the blocks lack that their main layers hold."""
    reference: tuple[str, frozenset[str]] | None
    """The last main layer compared against: its prefix and its relative names."""


def _mirroring(d: _Depths, i: int, sibling: Mapping[int, int]) -> _Mirroring:
    """Compare each block of depth ``i`` with the main layer it mirrors: the one sharing the
    most names, or its siblings' where the block is gone; a main layer of another kind is
    skipped (the main-model check reports the block's own kind gone)."""
    mirrors: list[tuple[str, str]] = []
    missing: set[str] = set()
    reference: tuple[str, frozenset[str]] | None = None
    if not d.family.layout.inner_mirrors_main:
        return _Mirroring(mirrors, missing, reference)
    own_forms = {f for n in d.own[i] for f in stored_forms(n)}
    main_template = NameTemplate(d.family.layout.main_layer_prefix)
    for flat in d.flat_layers(i):
        prefix, inner = d.inner(i, flat)
        pool = d.candidates(flat)
        k = sibling.get(flat % d.span) if not inner else None
        picked = (k, pool[k]) if k is not None and k in pool else pick_reference(pool, inner)
        if picked is None:
            continue
        main_prefix = main_template.main_layer(picked[0])
        expected = in_block_form(picked[1], inner, main_prefix, d.tensors)
        if other_kind({r for r in inner if prefix + r not in own_forms}, expected):
            continue
        mirrors.append((prefix, main_prefix))
        missing |= lacking(d.family, expected, prefix, inner, d.tensors)
        reference = (main_prefix, picked[1])
    return _Mirroring(mirrors, missing, reference)


def _depth_report(
    d: _Depths, i: int, sibling: Mapping[int, int]
) -> tuple[MtpLayerReport, list[tuple[str, str]], _Mirroring]:
    """Depth ``i``: its layer report (what it holds and lacks), its copies present, and how
    its blocks mirror the main layers."""
    present = d.members.get(i, set())
    missing = {n for n in d.own[i] - present if not present.intersection(stored_forms(n))}
    copies, copies_missing = _copies(d, i, present)
    missing |= copies_missing
    mirroring = _mirroring(d, i, sibling)
    missing |= mirroring.missing
    if mirroring.reference is not None:
        mtp_only = d.own[i] | {d.fill(c.template, i) for c in d.family.layout.copies}
        missing |= own_parts_lacking(mtp_only, present, *mirroring.reference, d.tensors)
    first = d.fill(d.family.layout.layer_prefix, i * d.span, d.span)
    return _layer_report(i, first, present, missing, d.tensors), copies, mirroring


def _effective_family(
    config: Mapping[str, Any], tensors: Mapping[str, TensorMeta]
) -> tuple[MtpFamily | None, int]:
    """The family, and the layers nested in a Megatron MTP depth (0 when none): a hybrid save
    whose config may not say so (mcore-bridge's args.json) is hybrid by its names."""
    family = detect_family(config)
    nested_family = FAMILY_BY_NAME.get(family.nested_as) if family is not None else None
    nested = _nested_positions(tensors) if nested_family is not None else 0
    return (nested_family if nested_family is not None and nested else family), nested


def analyse(
    config: Mapping[str, Any], tensors: Mapping[str, TensorMeta], config_path: str | None = None
) -> MtpAnalysis:
    """Find the MTP layers of a checkpoint and what each one lacks."""
    family, nested = _effective_family(config, tensors)
    declared = declared_count(config, family, config_path)
    hidden = _hidden_layers(
        config, config_path, family.count.hidden_layers_key if family else "num_hidden_layers"
    )
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    names = sorted(tensors)
    if family is None:
        return _analyse_unknown(model_type, declared, hidden, names, tensors)
    joined = joined_names(names)
    base = _mtp_base(family, names, joined, hidden)
    d, wanted = _depths(family, config, tensors, names, joined, base, nested, declared)
    sibling = _siblings(d, wanted)
    layers: list[MtpLayerReport] = []
    references: dict[int, str] = {}
    mirrors: list[tuple[str, str]] = []
    copies: list[tuple[str, str]] = []
    for i in wanted:
        layer, found, mirroring = _depth_report(d, i, sibling)
        layers.append(layer)
        copies += found
        mirrors += mirroring.mirrors
        if mirroring.mirrors:
            references[i] = "*, ".join(m for _, m in mirroring.mirrors)
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
    needed = family.layout.main_shared[:1] if tied_head(config) else family.layout.main_shared
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
