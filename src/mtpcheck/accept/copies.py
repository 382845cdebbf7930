"""Which embedding and output head each acceptance figure drafts through.

A DeepSeek-style checkpoint stores copies of the main embedding and head inside its MTP layer
(``model.layers.{n}.embed_tokens``, ``shared_head.head``). vLLM never uses them: its MTP
proposer shares the target model's embedding and head with the layer
(``llm_base_proposer.py``, ``_maybe_share_embeddings`` / ``_maybe_share_lm_head``, vLLM 0.32),
and so does ``--draft-rule engine``; the teacher-forced figures and the training rule use the
stored copies, as megatron-core's training did. Where the copies equal the main tensors byte
for byte this makes no difference; where they differ, the report says which figure used which.
"""

from __future__ import annotations

from itertools import zip_longest

from mtpcheck.families import MtpAnalysis
from mtpcheck.model import Checkpoint, Finding, Status

_CHUNK = 8 << 20
COPIES_TITLE = "MTP embedding and head each figure drafts through"


def _same_bytes(ckpt: Checkpoint, a: str, b: str) -> bool | None:
    """Byte equality of two tensors (dtype and shape first); None when they cannot be read."""
    ta, tb = ckpt.tensors[a], ckpt.tensors[b]
    if (ta.dtype, tuple(ta.shape)) != (tb.dtype, tuple(tb.shape)):
        return False
    if not (ta.readable and tb.readable):
        return None
    pairs = zip_longest(ckpt.read_chunks(a, _CHUNK), ckpt.read_chunks(b, _CHUNK))
    return all(x == y for x, y in pairs)


def copies_finding(ckpt: Checkpoint, analysis: MtpAnalysis) -> list[Finding]:
    """One WARN finding per stored copy whose bytes differ from its main tensor: the engine
    and the teacher-forced figures then draft through different weights. Nothing when they
    are equal (or cannot be read: ``inspect``'s shared-copies check reports that)."""
    return [
        Finding(
            copy,
            Status.WARN,
            f"differs from {main}: vLLM (and --draft-rule engine) drafts through {main}, "
            "the teacher-forced figures through this stored copy",
        )
        for copy, main in analysis.copies
        if _same_bytes(ckpt, copy, main) is False
    ]
