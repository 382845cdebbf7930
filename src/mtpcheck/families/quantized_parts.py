"""MTP completeness of quantized parameters: which stored parts (scales, zero points,
shapes) an MTP layer needs, judged per logical parameter against the main layers (pure)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from mtpcheck.families.interface import MtpFamily
from mtpcheck.model import TensorMeta
from mtpcheck.params import (
    LogicalParam,
    group,
    logical_name,
    quantized_modules,
    stored_forms,
)


def lacking(
    family: MtpFamily,
    expected: Collection[str],
    prefix: str,
    inner: Collection[str],
    tensors: Mapping[str, TensorMeta],
) -> set[str]:
    """Full names of the reference layer's tensors (``expected``, relative) that the MTP block
    under ``prefix`` (holding ``inner``, relative) lacks and should hold.

    Completeness is judged per logical parameter: a parameter the block holds in another form
    than the main layer (BF16 where the main layer is FP8 or packed INT4, or the other way
    round) is there; its side parts (scales, zero points, shapes) are needed only where the
    block's own copy is quantized.
    """
    absent = set(expected).difference(inner)
    if not absent:
        return set()
    held = group(prefix + rel for rel in inner)
    main_packed = quantized_modules(expected)
    missing = set()
    for rel in absent:
        if rel.startswith(family.layout.block_lacks):
            continue  # main layers hold it, MTP blocks never do
        logical, role = logical_name(rel, main_packed)
        param = held.get(prefix + logical)
        if param is not None and (role.holds_values or not param.quantized(tensors)):
            continue
        missing.add(prefix + rel)
    return missing


def _values_key(param: LogicalParam, tensors: Mapping[str, TensorMeta]) -> tuple[str, str] | None:
    """How ``param``'s values are stored: (suffix, dtype) of its weight or packed weight."""
    values = param.values
    meta = tensors.get(values) if values is not None else None
    return (values.rpartition(".")[2], meta.dtype) if values and meta else None


def own_parts_lacking(
    names: Iterable[str],
    present: set[str],
    main_prefix: str,
    main_rel: frozenset[str],
    tensors: Mapping[str, TensorMeta],
) -> set[str]:
    """Side parts (scales, shapes) a quantized MTP-only parameter lacks: those that every
    main-layer parameter stored in the same form holds (a W4A16 ``eh_proj.weight_packed``
    needs the ``weight_scale`` and ``weight_shape`` the main layer's packed weights have)."""
    needed: dict[tuple[str, str], set[str]] = {}
    for param in group(main_prefix + rel for rel in main_rel).values():
        key = _values_key(param, tensors)
        if key is None or not param.quantized(tensors):
            continue
        sides = {n.rpartition(".")[2] for r, n in param.parts if not r.holds_values}
        needed[key] = needed[key] & sides if key in needed else sides
    lacking: set[str] = set()
    for name in names:
        own = group(f for f in stored_forms(name) if f in present).get(name)
        if own is None or not own.quantized(tensors):
            continue
        key = _values_key(own, tensors)
        have = {n.rpartition(".")[2] for n in own.stored}
        module = name.rpartition(".")[0]
        lacking |= {f"{module}.{side}" for side in needed.get(key, set()) - have} if key else set()
    return lacking
