"""Chunks re-cut to the read_chunks contract line up whatever the reader yields."""

from __future__ import annotations

import numpy as np

from mtpcheck.chunks import rechunk


def test_irregular_chunks_are_recut_to_the_exact_size() -> None:
    data = bytes(range(256)) * 5
    pieces = [data[:3], memoryview(data[3:700]), bytearray(data[700:701]), data[701:]]
    out = list(rechunk(pieces, 100))
    assert [len(c) for c in out] == [100] * 12 + [80]
    assert b"".join(out) == data
    assert all(type(c) is bytes for c in out)


def test_regular_bytes_pass_through_uncopied_and_views_become_bytes() -> None:
    chunk = b"x" * 64
    view = memoryview(np.arange(16, dtype=np.uint32).view(np.uint8))
    out = list(rechunk([chunk, view], 64))
    assert out[0] is chunk
    assert type(out[1]) is bytes and out[1] == view.tobytes()
    assert list(rechunk([], 8)) == []


def test_slice_of_spans_crosses_span_boundaries() -> None:
    from mtpcheck.formats.chunked_read import slice_spans
    from mtpcheck.model import ByteSpan

    spans = [ByteSpan("a", 100, 10), ByteSpan("b", 0, 5), ByteSpan("c", 40, 20)]
    assert slice_spans(spans, 8, 9) == [
        ByteSpan("a", 108, 2),
        ByteSpan("b", 0, 5),
        ByteSpan("c", 40, 2),
    ]
    assert slice_spans(spans, 0, 35) == spans
    assert slice_spans(spans, 15, 20) == [ByteSpan("c", 40, 20)]
    assert slice_spans(spans, 12, 0) == []
