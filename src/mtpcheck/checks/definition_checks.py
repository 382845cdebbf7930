"""A main layer against its family's definition: every parameter the model's own code builds a
layer of its kind with (:mod:`mtpcheck.families.definitions`), so that a tensor lost from every
layer of a kind, or from the one layer of its kind, is named (pure).

A layer is whole when it holds every parameter of one of the family's layer variants; where it
holds none whole, the variant it comes closest to names what it lacks. Where the config says
which layers are MoE, only variants with (or without) routed experts are candidates. Routed
experts stored fused (transformers 5's ``mlp.experts.gate_up_proj``) or stacked (mlx-lm's
``switch_mlp``) are compared as the per-expert parameters they hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mtpcheck.checks.main_layers import MainLayer
from mtpcheck.families.definitions import Definition
from mtpcheck.model import Finding, Status
from mtpcheck.params import FUSED_EXPERTS
from mtpcheck.units import first_few

_STACKED = "mlp.switch_mlp."
"""mlx-lm's stacked experts: ``mlp.switch_mlp.up_proj.weight`` holds every expert's."""
_EXPERTS = "mlp.experts.*."


def _per_expert(name: str) -> tuple[str, ...]:
    """The per-expert parameters a fused or stacked expert tensor holds; ``name`` itself for
    any other."""
    for fused, projections in FUSED_EXPERTS.items():
        if name == fused or name.endswith("." + fused):
            head = name[: len(name) - len(fused)]
            return tuple(f"{head}{_EXPERTS}{p}.weight" for p in projections)
    if _STACKED in name:
        return (name.replace(_STACKED, _EXPERTS, 1),)
    return (name,)


def _normal(names: frozenset[str]) -> frozenset[str]:
    """Parameters with fused and stacked experts written per expert."""
    return frozenset(p for n in names for p in _per_expert(n))


def _routed(variant: frozenset[str]) -> bool:
    return any(".experts.*." in n for n in variant)


@dataclass(frozen=True)
class _Variants:
    """A definition's layer variants in the names layers are compared in, worked out once."""

    each: tuple[frozenset[str], ...]
    known: frozenset[str]
    """Every parameter any variant has."""

    @classmethod
    def of(cls, definition: Definition) -> _Variants:
        each = tuple(_normal(v) for v in definition.layers)
        return cls(each, frozenset().union(*each))


def _missing(variants: _Variants, present: frozenset[str], moe: bool | None) -> frozenset[str]:
    """What a layer holding ``present`` (each parameter known to some variant) lacks of the
    variant it comes closest to; nothing when it holds one whole. ``moe``: whether the config
    makes it an MoE layer, where it says."""
    candidates = [v for v in variants.each if moe is None or _routed(v) == moe]
    best = min(
        candidates or variants.each,
        key=lambda v: (len(v - present), -len(v & present), sorted(v)),
    )
    return best - present


def _message(definition: Definition, prefix: str, lacking: frozenset[str]) -> str:
    """What a layer lacks of its definition, each tensor named in full (a routed expert's
    index ``*``: every expert lacks it)."""
    built = " / ".join(definition.built_by)
    full = [prefix + n for n in sorted(lacking)]
    return (
        f"{len(full)} tensor(s) its definition holds missing ({definition.source}'s {built} "
        f"builds a layer of this kind with them): {first_few(full, 4)}"
    )


@dataclass(frozen=True)
class Held:
    """The main layers held to a definition."""

    problems: Mapping[int, str]
    """Layer number -> what it lacks of its definition, in words (only layers that lack some)."""
    lacking: Mapping[int, frozenset[str]]
    """Layer number -> the parameters it lacks of its definition (as :attr:`problems`)."""
    described: frozenset[int]
    """Layers the definition describes (the others hold a parameter it does not know)."""
    unknown: Mapping[int, frozenset[str]]
    """Layer number -> the parameters it holds that no variant of its definition has: such a
    layer is left to its peers."""

    @property
    def foreign(self) -> frozenset[str]:
        """Parameters some layer holds that no layer of the definition has: no loss of the
        layers that lack them."""
        return frozenset().union(*self.unknown.values())

    def told(self, k: int) -> frozenset[str]:
        """What a peer comparison of layer ``k`` leaves out: what the definition already named
        lost, and the foreign parameters."""
        return self.lacking.get(k, frozenset()) | self.foreign


def definition_problems(
    definition: Definition,
    layers: Mapping[int, MainLayer],
    prefix_of: Mapping[int, str],
    moe_layers: frozenset[int] | None,
) -> Held:
    """Every present main layer held to ``definition``; layers of the same parameters (the
    58 MoE layers of DeepSeek-V3) are compared once."""
    variants = _Variants.of(definition)
    found: dict[int, str] = {}
    lost: dict[int, frozenset[str]] = {}
    unknown: dict[int, frozenset[str]] = {}
    lacking_by: dict[tuple[frozenset[str], bool | None], frozenset[str]] = {}
    for k, layer in layers.items():
        present = _normal(layer.names)
        if present - variants.known:
            unknown[k] = present - variants.known
            continue
        moe = None if moe_layers is None else k in moe_layers
        key = (present, moe)
        if key not in lacking_by:
            lacking_by[key] = _missing(variants, present, moe)
        lacking = lacking_by[key]
        if not layer.routed:  # a layer without routed experts is said so by the expert check
            lacking = frozenset(n for n in lacking if "*" not in n)
        if lacking:
            lost[k] = lacking
            found[k] = _message(definition, prefix_of[k], lacking)
    described = frozenset(layers) - frozenset(unknown)
    return Held(found, lost, described, unknown)


def unknown_finding(
    definition: Definition, held: Held, prefix_of: Mapping[int, str]
) -> Finding | None:
    """A WARN naming the parameters main layers hold that no layer of the definition has
    (an engine built from the model code refuses or drops them); None where there are none."""
    if not held.unknown:
        return None
    names = sorted(prefix_of[k] + n for k, ns in held.unknown.items() for n in ns)
    built = " / ".join(definition.built_by)
    return Finding(
        "main layers",
        Status.WARN,
        f"{len(names)} tensor(s) no layer of {definition.source}'s {built} holds (a layer kind "
        f"or option its configs do not show; those layers are held to their peers only): "
        f"{first_few(names, 4)}",
    )
