"""Resolve the HF <-> Megatron tensor correspondence of one checkpoint.

A plan is built from the names one side actually holds, so it maps exactly what is there:
a layer without biases gets no bias rule, an MTP layer missing an expert gets no rule for
it, and every name no rule covers is listed as unmapped rather than silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mtpcheck.errors import ConfigKeyError, MtpcheckError
from mtpcheck.families import (
    FAMILIES,
    ConcatOrder,
    MtpFamily,
    declared_count,
    depth_span,
    detect_family,
    fill_template,
    hidden_layer_count,
)
from mtpcheck.families.name_templates import EXPERT, NameTemplate, depth_of
from mtpcheck.layouts import MegatronLayout
from mtpcheck.mapping.rules import (
    DECODER_RULES,
    FUSED_EXPERT_RULES,
    HYBRID_KIND_MARKERS,
    HYBRID_RULES,
    MEGATRON_MTP_WRAPPER,
    Kind,
    top_level,
)
from mtpcheck.mapping.transforms import Gdn, Qkv
from mtpcheck.model.config_keys import is_int, text_value

Side = Literal["hf", "megatron"]


class MappingError(MtpcheckError):
    """The checkpoint cannot be mapped (unsupported family, inconsistent shapes)."""


@dataclass(frozen=True)
class TensorMapping:
    """One Megatron tensor and the HF tensors it corresponds to."""

    megatron: str
    hf: tuple[str, ...]
    kind: Kind
    qkv: Qkv | None = None
    gdn: Gdn | None = None
    expert: int | None = None
    """The slice of the HF tensor this Megatron tensor is (:attr:`Kind.FUSED_EXPERT`)."""


@dataclass(frozen=True)
class Plan:
    """Every correspondence of one checkpoint, plus what has no counterpart."""

    family: MtpFamily
    hf_config: Mapping[str, Any]
    mappings: tuple[TensorMapping, ...]
    copies: tuple[tuple[str, str], ...]
    """(HF copy, HF main tensor): stored by HF only; Megatron shares the main tensor."""
    unmapped: tuple[str, ...]
    """Names on the planned side that no rule covers."""
    mtp_layers: int
    num_layers: int
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE

    def by_megatron(self) -> dict[str, TensorMapping]:
        """Megatron name -> its mapping."""
        return {m.megatron: m for m in self.mappings}

    def by_hf(self) -> dict[str, TensorMapping]:
        """HF name -> its mapping (planned from Megatron names, where each HF tensor has one)."""
        return {h: m for m in self.mappings for h in m.hf}


def mapped_families() -> str:
    """The families with an HF <-> Megatron mapping, in words (for refusals)."""
    return ", ".join(f.display for f in FAMILIES if f.megatron is not None and f.model_types)


def mappable_family(hf_config: Mapping[str, Any]) -> MtpFamily:
    """The family of ``hf_config``, which must have an HF <-> Megatron mapping
    (:class:`MappingError` otherwise)."""
    family = detect_family(hf_config)
    if family is None:
        raise MappingError(
            f"model_type {hf_config.get('model_type')!r} is not a known MTP family; "
            "no HF <-> Megatron mapping"
        )
    if family.megatron is None:
        raise MappingError(f"no HF <-> Megatron mapping for {family.display} yet")
    return family


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        found = text_value(config, key, is_int)
        if found:
            return int(found[1])
    return None


def qkv_layout(
    family: MtpFamily,
    config: Mapping[str, Any],
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> Qkv:
    """How the config's attention heads lay out Megatron's fused QKV tensor in ``layout``."""
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    if heads is None or hidden is None:
        raise ConfigKeyError("num_attention_heads and hidden_size", "the HF <-> Megatron mapping")
    groups = _int(config, "num_key_value_heads") or heads
    head_dim = _int(config, "head_dim") or hidden // heads
    per_head = layout is MegatronLayout.MCORE_BRIDGE
    assert family.megatron is not None
    gated = family.megatron.gated_attention
    return Qkv(heads, groups, head_dim, gated=gated, gate_per_head=per_head)


def gdn_layout(config: Mapping[str, Any]) -> Gdn | None:
    """The gated-delta-net head layout, for configs with linear-attention layers."""
    sizes = [
        _int(config, key)
        for key in (
            "linear_num_key_heads",
            "linear_key_head_dim",
            "linear_num_value_heads",
            "linear_value_head_dim",
        )
    ]
    if any(v is None for v in sizes):
        return None
    nk, dk, nv, dv = (int(v) for v in sizes)  # type: ignore[arg-type]
    if nk <= 0 or nv % nk:
        raise MappingError(f"linear_num_value_heads {nv} is not a multiple of {nk} key heads")
    return Gdn(nk, dk, nv, dv)


def _mtp_count(
    side: Side,
    family: MtpFamily,
    names: Collection[str],
    config: Mapping[str, Any],
    base: int,
    span: int,
) -> int:
    """Highest MTP index present on this side, or the declared count, whichever is larger."""
    found: set[int] = set()
    if side == "megatron":
        pattern = re.compile(r"^mtp\.layers\.(\d+)\.")
        found = {int(m.group(1)) for n in names if (m := pattern.match(n))}
    else:  # flat HF layers where ``span`` > 1, else the layers and their wrapper tensors
        head = family.layout.head_parts
        assert head is not None
        templates = (
            (family.layout.layer_prefix,) if span > 1 else (family.layout.layer_prefix, *head)
        )
        for template in map(NameTemplate, templates):
            if template.fixed:
                if template.text in names:
                    found.add(0)
                continue
            found |= {
                depth_of(hit[0], base, span) for n in names if (hit := template.match_prefix(n))
            }
    count = declared_count(config, family, None)
    declared = (count.value or 0) if count.from_key else 0
    return max([declared, *(i + 1 for i in found if i >= 0)])


def _experts(names: Collection[str], prefix: str, side: Side) -> list[int]:
    middle = (
        r"(?:mlp|mixer)\.experts\.(\d+)\."
        if side == "hf"
        else r"mlp\.experts\.local_experts\.(\d+)\."
    )
    pattern = re.compile("^" + re.escape(prefix) + middle)
    return sorted({int(m.group(1)) for n in names if (m := pattern.match(n))})


def _fused_experts(
    hf_prefix: str, meg_prefix: str, names: Collection[str], experts: int | None
) -> list[TensorMapping]:
    """Per-expert mappings of an HF layer that stores its routed experts fused."""
    out = []
    for fused, megatron in FUSED_EXPERT_RULES:
        hf = hf_prefix + fused
        if hf not in names:
            continue
        if not experts:
            raise ConfigKeyError("num_experts", f"the HF <-> Megatron mapping (to split {hf})")
        out += [
            TensorMapping(
                meg_prefix + NameTemplate(megatron).expert(e), (hf,), Kind.FUSED_EXPERT, expert=e
            )
            for e in range(experts)
        ]
    return out


def _family_name(family: MtpFamily, relative: str) -> str:
    """A rule's HF name (relative to its layer) as the family spells it."""
    assert family.megatron is not None
    for canonical, own in family.megatron.hf_aliases:
        if relative.startswith(canonical):
            return own + relative[len(canonical) :]
    return relative


def _layer(
    hf_prefix: str,
    meg_prefix: str,
    names: Collection[str],
    side: Side,
    qkv: Qkv,
    family: MtpFamily,
    gdn: Gdn | None = None,
    fused_experts: int | None = None,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> list[TensorMapping]:
    out = _fused_experts(hf_prefix, meg_prefix, names, fused_experts) if side == "hf" else []
    experts = _experts(names, hf_prefix if side == "hf" else meg_prefix, side)
    mla_marker = (
        hf_prefix + "self_attn.kv_a_proj_with_mqa.weight"
        if side == "hf"
        else meg_prefix + "self_attention.linear_kv_down_proj.weight"
    )
    assert family.megatron is not None
    traits = {
        "mla" if mla_marker in names else "gqa",
        family.megatron.shared_expert_style,
        "gdn_split" if family.megatron.gdn_split else "gdn_fused",
        layout.value,
    }
    if family.megatron.hybrid_layers:
        marker = 1 if side == "hf" else 2
        traits = {
            k[0]
            for k in HYBRID_KIND_MARKERS
            if (hf_prefix, meg_prefix)[marker - 1] + k[marker] in names
        }
    gdn_kinds = (Kind.GDN_IN_PROJ, Kind.GDN_SPLIT_IN_PROJ, Kind.GDN_HEAD_GROUPED)
    for rule in HYBRID_RULES if family.megatron.hybrid_layers else DECODER_RULES:
        if rule.when and not set(rule.when.split("+")) <= traits:
            continue
        indices = experts if NameTemplate(rule.megatron).holds(EXPERT) else [None]
        for e in indices:

            def sub(s: str, e: int | None = e) -> str:
                return s if e is None else NameTemplate(s).expert(e)

            hf = tuple(hf_prefix + _family_name(family, sub(s)) for s in rule.hf)
            meg = meg_prefix + sub(rule.megatron)
            if side == "hf":
                needed = (*hf, *(hf_prefix + _family_name(family, r) for r in rule.requires))
                if not all(n in names for n in needed):
                    continue
            elif meg not in names:
                continue
            if rule.kind in gdn_kinds and gdn is None:
                raise ConfigKeyError(
                    "the linear_* gated delta net sizes", f"the HF <-> Megatron mapping of {hf[0]}"
                )
            out.append(
                TensorMapping(
                    meg,
                    hf,
                    rule.kind,
                    qkv if rule.kind is Kind.QKV else None,
                    gdn if rule.kind in gdn_kinds else None,
                )
            )
    return out


def build_plan(
    hf_config: Mapping[str, Any],
    names: Collection[str],
    side: Side,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> Plan:
    """Plan the correspondence for a checkpoint holding ``names`` on ``side``, the Megatron
    side in ``layout``."""
    family = mappable_family(hf_config)
    assert family.megatron is not None and family.layout.head_parts is not None
    base = hidden_layer_count(family, hf_config)
    if base is None:
        raise ConfigKeyError("num_hidden_layers", "the HF <-> Megatron mapping")
    qkv = qkv_layout(family, hf_config, layout)
    gdn = gdn_layout(hf_config)
    experts = _int(hf_config, "num_experts", "n_routed_experts")
    span = depth_span(family, hf_config) if family.megatron.hybrid_layers else 1
    mtp = _mtp_count(side, family, names, hf_config, base, span)

    mappings: list[TensorMapping] = []
    main_layer = NameTemplate(family.layout.main_layer_prefix)
    for k in range(base):
        hf_layer = main_layer.main_layer(k)
        meg_layer = f"decoder.layers.{k}."
        mappings += _layer(hf_layer, meg_layer, names, side, qkv, family, gdn, experts, layout)
    for i in range(mtp):
        for t in range(span):
            inner_hf = fill_template(family.layout.layer_prefix, i * span + t, base)
            inner_meg = f"mtp.layers.{i}.transformer_layer." + (f"layers.{t}." if span > 1 else "")
            mappings += _layer(inner_hf, inner_meg, names, side, qkv, family, gdn, experts, layout)
        for template, rel in zip(family.layout.head_parts, MEGATRON_MTP_WRAPPER, strict=True):
            if NameTemplate(template).fixed and i > 0:
                continue
            hidden_first = family.layout.concat_order is ConcatOrder.HIDDEN_FIRST
            swap = rel == "eh_proj.weight" and hidden_first
            kind = Kind.SWAP_HALVES if swap else Kind.COPY
            hf_name = fill_template(template, i, base, span)
            meg_name = f"mtp.layers.{i}.{rel}"
            if (hf_name if side == "hf" else meg_name) in names:
                mappings.append(TensorMapping(meg_name, (hf_name,), kind))
    for hf_name, meg_name in top_level(family.layout.main_shared, family.layout.main_norm):
        if (hf_name if side == "hf" else meg_name) in names:
            mappings.append(TensorMapping(meg_name, (hf_name,), Kind.COPY))

    # Copies belong to MTP layers that exist: none are invented for a layer that is gone.
    present = {int(m.megatron.split(".")[2]) for m in mappings if m.megatron.startswith("mtp.")}
    copies = tuple(
        (fill_template(c.template, i, base), c.main)
        for i in range(mtp)
        if side == "hf" or i in present
        for c in family.layout.copies
    )
    covered = {n for m in mappings for n in (m.hf if side == "hf" else (m.megatron,))}
    if side == "hf":
        covered |= {c for c, _ in copies}
    unmapped = tuple(sorted(n for n in names if n not in covered))
    return Plan(family, hf_config, tuple(mappings), copies, unmapped, mtp, base, layout)
