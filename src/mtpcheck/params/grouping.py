"""Stored tensors grouped into logical parameters (pure functions over names and headers).

A logical parameter is what the model computes with: ``<module>.weight``. A checkpoint stores
it as one tensor, or, quantized, as several (:mod:`mtpcheck.params.parts`): completeness asks
whether the parameter is there, in whatever form, and which of its side parts its form needs.
Any tensor that is no quantizer's part (a norm, a bias, a router) is a parameter of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from mtpcheck.dtypes import is_high_precision
from mtpcheck.model import TensorMeta
from mtpcheck.params.parts import (
    LOGICAL_SUFFIX,
    PART_BY_SUFFIX,
    PARTS,
    SUFFIX_COMPONENTS,
    Role,
    StoredPart,
)


@dataclass(frozen=True)
class LogicalParam:
    """One parameter and the stored tensors that hold it."""

    name: str
    parts: tuple[tuple[Role, str], ...]
    """(role, stored name) of each stored part, in the order :class:`Role` lists roles."""

    @property
    def stored(self) -> tuple[str, ...]:
        """Names of the stored tensors that make up the parameter."""
        return tuple(name for _, name in self.parts)

    def part(self, role: Role) -> str | None:
        """The stored tensor holding ``role``; None when the parameter has none."""
        return next((name for r, name in self.parts if r is role), None)

    @property
    def values(self) -> str | None:
        """The stored tensor holding the values: the packed weight, else the weight."""
        return self.part(Role.PACKED) or self.part(Role.WEIGHT)

    def quantized(self, tensors: Mapping[str, TensorMeta]) -> bool:
        """Whether the values are stored quantized: packed, or a weight that is no 16- or
        32-bit float (FP8, INT8). Side parts alone do not make a parameter quantized."""
        if self.part(Role.PACKED) is not None:
            return True
        weight = self.values
        meta = tensors.get(weight) if weight is not None else None
        return meta is not None and not is_high_precision(meta.dtype)


_LAST_COMPONENTS = frozenset(p.suffix.rpartition(".")[2] for p in PARTS)
"""The last name component of every part's suffix: a name ending otherwise is no part."""


@lru_cache(maxsize=1 << 16)
def _split(name: str) -> tuple[str, StoredPart] | None:
    """``<module>.<suffix>`` -> (module, part) where the suffix (one or more name components,
    the longest that matches) is a quantizer's part. Cached: the checks ask again about the
    same names (an MTP layer's, its main counterparts'), and names of 92k-tensor checkpoints
    mostly end in a component no part ends in, which is answered before any join."""
    if name.rpartition(".")[2] not in _LAST_COMPONENTS:
        return None
    components = name.rsplit(".", SUFFIX_COMPONENTS)  # the module's own dots stay in [0]
    for k in range(min(SUFFIX_COMPONENTS, len(components) - 1), 0, -1):
        part = PART_BY_SUFFIX.get(".".join(components[-k:]))
        if part is not None:
            return ".".join(components[:-k]), part
    return None


def quantized_modules(names: Iterable[str]) -> set[str]:
    """The modules among ``names`` whose generic side parts (``scales``, ``qzeros``,
    ``g_idx``, ``biases``) are a quantizer's: those storing a packed weight, and those storing
    a ``weight`` beside ``scales`` (mlx-lm)."""
    return _quantized_of(found for name in names if (found := _split(name)) is not None)


def _quantized_of(split: Iterable[tuple[str, StoredPart]]) -> set[str]:
    """:func:`quantized_modules` of names already split into (module, part)."""
    packed, scaled, weighted = set(), set(), set()
    for module, part in split:
        if part.role is Role.PACKED:
            packed.add(module)
        elif part.suffix == "scales":
            scaled.add(module)
        elif part.suffix == LOGICAL_SUFFIX:
            weighted.add(module)
    return packed | (scaled & weighted)


def logical_name(name: str, quantized_modules: Collection[str] = ()) -> tuple[str, Role]:
    """The parameter ``name`` is a part of, and its role there. ``quantized_modules`` (see
    :func:`quantized_modules`) decide the parts whose suffix is generic (AutoAWQ's ``scales``)."""
    return _logical(name, _split(name), quantized_modules)


def _logical(
    name: str, found: tuple[str, StoredPart] | None, quantized_modules: Collection[str]
) -> tuple[str, Role]:
    """:func:`logical_name` of ``name``, split already into ``found``."""
    if found is None:
        return name, Role.WEIGHT
    module, part = found
    if part.needs_packed and module not in quantized_modules:
        return name, Role.WEIGHT
    return f"{module}.{LOGICAL_SUFFIX}", part.role


def group(names: Iterable[str]) -> dict[str, LogicalParam]:
    """The logical parameters of ``names``, by parameter name."""
    split = [(name, _split(name)) for name in names]
    packed = _quantized_of(found for _, found in split if found is not None)
    grouped: dict[str, list[tuple[Role, str]]] = {}
    for name, found in split:
        logical, role = _logical(name, found, packed)
        grouped.setdefault(logical, []).append((role, name))
    return {
        logical: LogicalParam(logical, tuple(sorted(parts, key=_part_order)))
        for logical, parts in grouped.items()
    }


_ROLE_ORDER = {role: k for k, role in enumerate(Role)}


def _part_order(part: tuple[Role, str]) -> tuple[int, str]:
    """Parts in the order :class:`Role` lists roles, then by name."""
    return _ROLE_ORDER[part[0]], part[1]


def stored_forms(logical: str) -> tuple[str, ...]:
    """Every name a part of parameter ``logical`` can be stored under (``logical`` first);
    just ``logical`` for a name that is not ``<module>.weight``. Placeholders (``{n}``) pass
    through, so this works on templates."""
    module, dot, suffix = logical.rpartition(".")
    if not dot or suffix != LOGICAL_SUFFIX:
        return (logical,)
    return (logical, *(f"{module}.{p.suffix}" for p in PARTS if p.suffix != LOGICAL_SUFFIX))
