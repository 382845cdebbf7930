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


def held(layer: MainLayer) -> frozenset[str]:
    """The layer's parameters in the definition's names."""
    return _normal(layer.names)


def _routed(variant: frozenset[str]) -> bool:
    return any(".experts.*." in n for n in variant)


def missing(
    definition: Definition, layer: MainLayer, moe: bool | None
) -> tuple[frozenset[str], frozenset[str]] | None:
    """(what the layer lacks of the variant it comes closest to, that variant); nothing
    lacking when it holds one variant whole; None where it holds a parameter no variant
    knows (the definition does not describe it). ``moe``: whether the config makes it an MoE layer,
    where it says."""
    present = held(layer)
    variants = [_normal(v) for v in definition.layers]
    if present - frozenset().union(*variants):
        # a parameter no variant has: a layer of a kind (or an option) the configs the
        # definition was built from do not show; its peers judge it
        return None
    candidates = [v for v in variants if moe is None or _routed(v) == moe]
    best = min(
        candidates or variants,
        key=lambda v: (len(v - present), -len(v & present), sorted(v)),
    )
    return best - present, best


def problems(
    definition: Definition, prefix: str, layer: MainLayer, moe: bool | None
) -> list[str] | None:
    """What the layer lacks of its definition, each tensor named in full (a routed expert's
    index ``*``: every expert lacks it); None where the definition does not describe it."""
    found = missing(definition, layer, moe)
    if found is None:
        return None
    lacking, _ = found
    if not layer.routed:  # a layer without routed experts is said so by the expert check
        lacking = frozenset(n for n in lacking if "*" not in n)
    if not lacking:
        return []
    built = " / ".join(definition.built_by)
    full = [prefix + n for n in sorted(lacking)]
    return [
        f"{len(full)} tensor(s) its definition holds missing ({definition.source}'s {built} "
        f"builds a layer of this kind with them): {first_few(full, 4)}"
    ]


@dataclass(frozen=True)
class Held:
    """The main layers held to a definition."""

    problems: Mapping[int, list[str]]
    """Layer number -> what it lacks of its definition (only layers that lack some)."""
    described: frozenset[int]
    """Layers the definition describes (the others hold a parameter it does not know)."""
    unknown: Mapping[int, frozenset[str]]
    """Layer number -> the parameters it holds that no variant of its definition has."""


def definition_problems(
    definition: Definition,
    layers: Mapping[int, MainLayer],
    prefix_of: Mapping[int, str],
    moe_layers: frozenset[int] | None,
) -> Held:
    """Every present main layer held to ``definition``."""
    found: dict[int, list[str]] = {}
    unknown: dict[int, frozenset[str]] = {}
    described: set[int] = set()
    known = frozenset().union(*(_normal(v) for v in definition.layers))
    for k, layer in layers.items():
        moe = None if moe_layers is None else k in moe_layers
        said = problems(definition, prefix_of[k], layer, moe)
        if said is None:
            unknown[k] = held(layer) - known
            continue
        described.add(k)
        if said:
            found[k] = said
    return Held(found, frozenset(described), unknown)


def unknown_finding(
    definition: Definition, held_: Held, prefix_of: Mapping[int, str]
) -> Finding | None:
    """A WARN naming the parameters main layers hold that no layer of the definition has
    (an engine built from the model code refuses or drops them); None where there are none."""
    if not held_.unknown:
        return None
    names = sorted(prefix_of[k] + n for k, ns in held_.unknown.items() for n in ns)
    built = " / ".join(definition.built_by)
    return Finding(
        "main layers",
        Status.WARN,
        f"{len(names)} tensor(s) no layer of {definition.source}'s {built} holds (a layer kind "
        f"or option its configs do not show; those layers are held to their peers only): "
        f"{first_few(names, 4)}",
    )
