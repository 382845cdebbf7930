"""How an MTP block compares with the main decoder layer it mirrors: which main layer that is,
the main layer's names as the block stores them, and whether the two are of one kind (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from mtpcheck.model import TensorMeta
from mtpcheck.params import FUSED_EXPERTS, group

_PER_EXPERT = re.compile(r"^mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj)\.")
PACKED_EXPERTS = tuple(FUSED_EXPERTS)
"""How transformers 5 and Qwen's BF16 releases store a layer's routed experts when packed."""


def in_block_form(
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


def other_kind(inner: set[str], expected: frozenset[str]) -> bool:
    """Whether a block and the main layer picked for it each hold parameters the other lacks
    (stored forms aside: a BF16 block beside quantized main layers is alike): a main layer of
    another kind, picked because the block's own is gone (which the main-model check reports),
    not the block's own loss."""
    if inner <= expected or expected <= inner:
        return False  # alike as stored (most checkpoints): no grouping needed
    mine, theirs = set(group(inner)), set(group(expected))
    return not mine <= theirs and not theirs <= mine


def pick_reference(
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
