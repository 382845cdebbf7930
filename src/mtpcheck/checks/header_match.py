"""Compare tensors whose bytes are not at hand: by their headers, and by whole-file hashes.

A Hub repository read by its headers still proves a lot for free: a tensor missing, added,
retyped or reshaped is a finding as with bytes; a tensor at the same offset of two files whose
LFS sha256 is equal is equal byte for byte. Anything else is reported as not compared.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtpcheck.checks.tensor_match import Compare, by_metadata
from mtpcheck.model import Checkpoint, HeadersOnly, TensorComparison, TensorStatus


def _sha(ckpt: Checkpoint, file: str) -> str | None:
    return ckpt.file_sha256(file) if isinstance(ckpt, HeadersOnly) else None


def compare_by_headers(
    a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
) -> list[TensorComparison]:
    """Each ``(a_name, b_name)`` pair judged without reading tensor bytes."""
    results = []
    for an, bn in pairs:
        verdict, ma, mb = by_metadata(a, an, b, bn)
        if ma is not None and mb is not None:
            sha = _sha(a, ma.file)
            same = sha is not None and sha == _sha(b, mb.file) and ma.offset == mb.offset
            verdict = TensorComparison(
                verdict.name,
                TensorStatus.EQUAL if same else TensorStatus.NOT_COMPARED,
                verdict.dtype,
                verdict.shape,
                ma.nbytes,
            )
        results.append(verdict)
    return results


def needs_headers_only(*checkpoints: Checkpoint) -> bool:
    """True when some checkpoint's tensor bytes cannot be read."""
    return any(isinstance(c, HeadersOnly) and c.why_no_bytes for c in checkpoints)


def proven_first(compare: Compare) -> Compare:
    """``compare`` for the pairs the headers and file hashes cannot settle; the others are
    judged without reading a byte (with ``--fetch``, a Hub file whose sha256 equals the other
    side's is not downloaded)."""

    def run(
        a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
    ) -> list[TensorComparison]:
        results = compare_by_headers(a, b, pairs)
        todo = [i for i, c in enumerate(results) if c.status is TensorStatus.NOT_COMPARED]
        if todo:
            for i, c in zip(todo, compare(a, b, [pairs[i] for i in todo]), strict=True):
                results[i] = c
        return results

    return run


def comparer_for(a: Checkpoint, b: Checkpoint, compare: Compare) -> Compare:
    """How to compare tensors of ``a`` and ``b``: by headers where a side's bytes are not at
    hand, hashes first where a side is fetched over the network, ``compare`` otherwise."""
    if needs_headers_only(a, b):
        return compare_by_headers
    if isinstance(a, HeadersOnly) or isinstance(b, HeadersOnly):
        return proven_first(compare)
    return compare
