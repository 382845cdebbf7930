"""Checkpoints whose routed experts are stored as one tensor (mlx-lm's stacked ``switch_mlp``,
transformers 5's fused ``gate_up_proj``) shown with one tensor per expert, as an HF checkpoint
stores them, so that ``diff`` and the drafter comparisons pair them by name.

Slice ``e`` of a stacked ``[experts, ...]`` tensor is a contiguous byte range of it, so each
per-expert tensor is the same file at a later offset: every reader of the checkpoint, the
tensor matcher's and the dequantizer's, reads it unchanged (no copy, no numpy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.model import Checkpoint, Naming, TensorMeta
from mtpcheck.params import FUSED_EXPERTS, STACKED_EXPERTS


def _stacked(name: str) -> tuple[str, str] | None:
    """(stacked infix, per-expert infix) where ``name`` is a stacked expert tensor."""
    return next(((s, e) for s, e in STACKED_EXPERTS.items() if s in name), None)


def has_stacked(tensors: Mapping[str, TensorMeta]) -> bool:
    """Whether any tensor is a stacked expert tensor."""
    return any(_stacked(n) for n in tensors)


def _slices(meta: TensorMeta, stacked: str, per_expert: str) -> dict[str, TensorMeta]:
    count = meta.shape[0] if meta.shape else 0
    if count == 0 or meta.nbytes % count:
        return {meta.name: meta}
    size = meta.nbytes // count
    found = {}
    for e in range(count):
        name = meta.name.replace(stacked, NameTemplate(per_expert).expert(e), 1)
        found[name] = dataclasses.replace(
            meta, name=name, shape=meta.shape[1:], offset=meta.offset + e * size, nbytes=size
        )
    return found


def unstacked(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with each stacked expert tensor shown as one tensor per expert; ``ckpt`` itself
    where it has none, or is not an HF checkpoint whose tensors are plain records."""
    if ckpt.naming is not Naming.HF or not dataclasses.is_dataclass(ckpt):
        return ckpt
    if not has_stacked(ckpt.tensors):
        return ckpt
    tensors: dict[str, TensorMeta] = {}
    for name, meta in ckpt.tensors.items():
        found = _stacked(name)
        tensors.update(_slices(meta, *found) if found else {name: meta})
    return dataclasses.replace(ckpt, tensors=tensors)


def _fused(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(prefix before ``mlp.experts``, per-expert projections) of a fused expert tensor."""
    for fused, projections in FUSED_EXPERTS.items():
        if name.endswith(fused):
            return name[: -len(fused)], projections
    return None


def _unfused_slices(
    meta: TensorMeta, prefix: str, projections: tuple[str, ...]
) -> dict[str, TensorMeta]:
    count = meta.shape[0] if len(meta.shape) == 3 else 0
    parts = count * len(projections)
    if count == 0 or meta.nbytes % parts or meta.shape[1] % len(projections):
        return {meta.name: meta}
    size = meta.nbytes // parts
    shape = (meta.shape[1] // len(projections), meta.shape[2])
    found = {}
    for e in range(count):
        for p, proj in enumerate(projections):
            name = f"{prefix}mlp.experts.{e}.{proj}.weight"
            offset = meta.offset + (e * len(projections) + p) * size
            found[name] = dataclasses.replace(
                meta, name=name, shape=shape, offset=offset, nbytes=size
            )
    return found


def unfused(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with each fused expert tensor (transformers 5's ``mlp.experts.gate_up_proj``
    ``[E, 2I, H]``, rows ``[gate; up]`` per expert, and ``down_proj``) shown as one tensor per
    expert and projection, each a contiguous byte range of it; ``ckpt`` itself where it has
    none, or is not an HF checkpoint whose tensors are plain records."""
    if ckpt.naming is not Naming.HF or not dataclasses.is_dataclass(ckpt):
        return ckpt
    if not any(_fused(n) for n in ckpt.tensors):
        return ckpt
    tensors: dict[str, TensorMeta] = {}
    for name, meta in ckpt.tensors.items():
        found = _fused(name)
        tensors.update(_unfused_slices(meta, *found) if found else {name: meta})
    return dataclasses.replace(ckpt, tensors=tensors)
