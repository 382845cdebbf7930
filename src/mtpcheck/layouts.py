"""Whose modules a Megatron checkpoint was saved from, where converters differ."""

from __future__ import annotations

import enum


class MegatronLayout(str, enum.Enum):
    """The rules that differ between the two are in :mod:`mtpcheck.mapping.rules`."""

    MEGATRON_CORE = "megatron-core"
    """megatron-core's own modules: what Megatron-Bridge, Megatron-LM, mbridge and the
    built-in converter write."""
    MCORE_BRIDGE = "mcore-bridge"
    """ModelScope mcore-bridge (ms-swift 4), whose gated delta net and gated attention are
    modules of its own (Qwen3-Next, Qwen3.5)."""
