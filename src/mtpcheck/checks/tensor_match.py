"""Bit-for-bit tensor comparison: raw bytes, dtype and shape decide; nothing else.

Bytes are streamed in bounded chunks. Only when two chunks differ is numpy used to count
the differing elements and, as context, the largest absolute difference.

Checkpoints whose tensors lie at known file offsets (they offer ``span_reader()``, as HF
safetensors do) take a fast path: each tensor is cut into segments that a few threads compare
in parallel (``MTPCHECK_THREADS``, default 4), each reading 1 MiB at a time into two buffers of
its own (so the bytes are compared while still in the CPU cache) with one file descriptor per
shard, each segment announced to the kernel before it is read (its readahead is off, so no
byte outside the tensors compared is read); ranges that are holes of sparse files on both
sides read as zeros and are not read.
Results keep the order of the request whatever the threads do.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mtpcheck.checks.widening import values_differing
from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import DTYPES, Kind, is_fp8, itemsize, top_bits_of
from mtpcheck.model import Checkpoint, HasSpanReader, TensorComparison, TensorMeta, TensorStatus
from mtpcheck.settings import THREADS

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]
"""How a command compares the tensors of two checkpoints, by (name in a, name in b) pairs:
:func:`compare_many`, or a wrapper of it (progress, headers first, ranks)."""

if TYPE_CHECKING:
    import numpy as np

CHUNK_BYTES = 4 * 1024 * 1024
"""Chunk size of the general path (readers without ``span_reader``)."""
READ_BYTES = 1024 * 1024
"""Read size of the fast path: two such buffers per thread stay in the CPU cache."""
SEGMENT_BYTES = 64 * 1024 * 1024
"""Unit of work of one thread on the fast path (a multiple of READ_BYTES)."""


def io_threads() -> int:
    """Threads of the fast path: ``$MTPCHECK_THREADS`` (:data:`mtpcheck.settings.THREADS`)."""
    return THREADS.given()


def compare(
    a: Checkpoint, a_name: str, b: Checkpoint, b_name: str, chunk_bytes: int = CHUNK_BYTES
) -> TensorComparison:
    """Compare tensor ``a_name`` of ``a`` with ``b_name`` of ``b``."""
    return compare_many(a, b, [(a_name, b_name)], chunk_bytes)[0]


def compare_many(
    a: Checkpoint,
    b: Checkpoint,
    pairs: Sequence[tuple[str, str]],
    chunk_bytes: int = CHUNK_BYTES,
    threads: int | None = None,
) -> list[TensorComparison]:
    """Compare each ``(a_name, b_name)`` pair; results in the order of ``pairs``."""
    results: list[TensorComparison] = []
    pending: list[tuple[int, TensorMeta, TensorMeta, str, str]] = []
    for an, bn in pairs:
        verdict, ma, mb = by_metadata(a, an, b, bn)
        if verdict.status is TensorStatus.DTYPE_CHANGED:
            verdict = replace(verdict, values_differing=values_differing(a, an, b, bn))
        if ma is not None and mb is not None:
            pending.append((len(results), ma, mb, an, bn))
        results.append(verdict)
    if not pending:
        return results
    if isinstance(a, HasSpanReader) and isinstance(b, HasSpanReader):
        span_a, span_b = a.span_reader, b.span_reader
        read_bytes = min(READ_BYTES, chunk_bytes)
        if read_bytes >= 8:
            read_bytes -= read_bytes % 8
        with span_a() as reader_a:
            if a is b:
                _compare_spans(results, pending, reader_a, reader_a, read_bytes, threads)
            else:
                with span_b() as reader_b:
                    _compare_spans(results, pending, reader_a, reader_b, read_bytes, threads)
        return results
    for index, ma, _, an, bn in pending:
        left = rechunk(a.read_chunks(an, chunk_bytes), chunk_bytes)
        right = rechunk(b.read_chunks(bn, chunk_bytes), chunk_bytes)
        results[index] = _compare_bytes(results[index], ma, left, right)
    return results


def by_metadata(
    a: Checkpoint, a_name: str, b: Checkpoint, b_name: str
) -> tuple[TensorComparison, TensorMeta | None, TensorMeta | None]:
    """The verdict metadata alone gives; both metas only when the bytes must be compared."""
    ma = a.tensors.get(a_name)
    mb = b.tensors.get(b_name)
    label = a_name if a_name == b_name else f"{a_name} ~ {b_name}"
    if ma is None or mb is None:
        status = TensorStatus.MISSING if mb is None else TensorStatus.EXTRA
        missing = TensorComparison(
            name=label,
            status=status,
            dtype=(ma.dtype if ma else None, mb.dtype if mb else None),
            shape=(ma.shape if ma else None, mb.shape if mb else None),
            nbytes=meta.nbytes if (meta := ma or mb) is not None else 0,
        )
        return missing, None, None
    base = TensorComparison(
        name=label,
        status=TensorStatus.EQUAL,
        dtype=(ma.dtype, mb.dtype),
        shape=(ma.shape, mb.shape),
        nbytes=ma.nbytes,
    )
    if ma.dtype != mb.dtype:
        return replace(base, status=TensorStatus.DTYPE_CHANGED), None, None
    if ma.shape != mb.shape:
        return replace(base, status=TensorStatus.SHAPE_CHANGED), None, None
    if not (ma.readable and mb.readable):
        return replace(base, status=TensorStatus.UNREADABLE), None, None
    return base, ma, mb


@dataclass
class _Diff:
    """Differences found in one segment (or a whole tensor)."""

    count: int = 0
    first: int | None = None
    """Flat index of the first differing element (byte index for sub-byte dtypes)."""
    max_diff: float | None = None

    def add(self, other: _Diff) -> None:
        self.count += other.count
        if self.first is None:
            self.first = other.first
        if other.max_diff is not None and (self.max_diff is None or other.max_diff > self.max_diff):
            self.max_diff = other.max_diff


def _compare_spans(
    results: list[TensorComparison],
    pending: list[tuple[int, TensorMeta, TensorMeta, str, str]],
    reader_a: Any,
    reader_b: Any,
    read_bytes: int,
    threads: int | None,
) -> None:
    segment_bytes = max(read_bytes, SEGMENT_BYTES - SEGMENT_BYTES % read_bytes)
    segments = [
        (job, ma, mb, start, min(ma.nbytes, start + segment_bytes))
        for job, (_, ma, mb, _, _) in enumerate(pending)
        for start in range(0, ma.nbytes, segment_bytes)
    ]
    # file order, so that a cold disk reads ahead; results are merged by job, in segment order
    order = sorted(
        range(len(segments)),
        key=lambda s: (segments[s][1].file, segments[s][1].offset + segments[s][3]),
    )
    found: list[_Diff | None] = [None] * len(segments)

    def work(buffers: list[bytearray]) -> Callable[[int], None]:
        def run(s: int) -> None:
            _, ma, mb, start, end = segments[s]
            found[s] = _compare_segment(reader_a, reader_b, ma, mb, start, end, read_bytes, buffers)

        return run

    _parallel(order, work, threads if threads is not None else io_threads())
    merged = [_Diff() for _ in pending]
    for s, (job, *_rest) in enumerate(segments):
        diff = found[s]
        assert diff is not None
        merged[job].add(diff)
    for (index, ma, _, _, _), diff in zip(pending, merged, strict=True):
        if diff.first is None:
            continue
        results[index] = replace(
            results[index],
            status=TensorStatus.BITS_DIFFER,
            differing_elements=diff.count,
            first_difference=_unravel(diff.first, ma.shape, byte_index=itemsize(ma.dtype) is None),
            max_abs_diff=diff.max_diff,
        )


def _compare_segment(
    reader_a: Any,
    reader_b: Any,
    ma: TensorMeta,
    mb: TensorMeta,
    start: int,
    end: int,
    read_bytes: int,
    buffers: list[bytearray],
) -> _Diff:
    diff = _Diff()
    if reader_a.is_hole(ma, start, end - start) and reader_b.is_hole(mb, start, end - start):
        return diff  # both read as zeros
    # holes on both sides somewhere in the segment: skip the chunks that are holes on both
    sparse = reader_a.has_hole(ma, start, end - start) and reader_b.has_hole(mb, start, end - start)
    for reader, meta in ((reader_a, ma), (reader_b, mb)):
        reader.prefetch(meta, start, end - start)
    size = itemsize(ma.dtype) or 1
    pos = start
    while pos < end:
        n = min(read_bytes, end - pos)
        if sparse and reader_a.is_hole(ma, pos, n) and reader_b.is_hole(mb, pos, n):
            pos += n
            continue
        if n == read_bytes:
            if not buffers:
                buffers += (bytearray(read_bytes), bytearray(read_bytes))
            ca, cb = buffers
            reader_a.readinto(ma, pos, memoryview(ca))
            reader_b.readinto(mb, pos, memoryview(cb))
        else:
            ca = reader_a.read(ma, pos, n)
            cb = reader_b.read(mb, pos, n)
        if ca != cb:  # memcmp
            count, first_here, value = _diff_chunk(ca, cb, size, ma.dtype)
            diff.add(_Diff(count, pos // size + first_here, value))
        pos += n
    return diff


def _parallel(
    order: list[int], work: Callable[[list[bytearray]], Callable[[int], None]], threads: int
) -> None:
    """Run ``work(buffers)(i)`` for each ``i`` of ``order`` on up to ``threads`` threads.

    Every thread has its own buffers. The first exception stops the others and is re-raised.
    """
    if threads <= 1 or len(order) <= 1:
        run = work([])
        for i in order:
            run(i)
        return
    queue = iter(order)  # next() on a list iterator is atomic under the GIL
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        run = work([])
        try:
            for i in queue:
                if stop.is_set():
                    return
                run(i)
        except BaseException as e:  # re-raised in the calling thread
            errors.append(e)
            stop.set()

    helpers = [
        threading.Thread(target=loop, name=f"mtpcheck-compare-{k}", daemon=True)
        for k in range(min(threads, len(order)) - 1)
    ]
    for t in helpers:
        t.start()
    try:
        loop()
    finally:
        stop.set()  # the queue is drained or failed: helpers finish their current segment
        for t in helpers:
            t.join()
    if errors:
        raise errors[0]


def _compare_bytes(
    base: TensorComparison, meta: TensorMeta, left: Iterator[bytes], right: Iterator[bytes]
) -> TensorComparison:
    width = itemsize(meta.dtype)
    size = width or 1
    differing = 0
    first: int | None = None
    max_diff: float | None = None
    position = 0
    for ca, cb in zip(left, right, strict=True):
        if ca != cb:
            count, first_here, diff = _diff_chunk(ca, cb, size, meta.dtype)
            differing += count
            if first is None:
                first = position // size + first_here
            if diff is not None and (max_diff is None or diff > max_diff):
                max_diff = diff
        position += len(ca)
    if first is None:
        return base
    return replace(
        base,
        status=TensorStatus.BITS_DIFFER,
        differing_elements=differing,
        first_difference=_unravel(first, meta.shape, byte_index=width is None),
        max_abs_diff=max_diff,
    )


def _unravel(flat: int, shape: tuple[int, ...], byte_index: bool) -> tuple[int, ...]:
    if byte_index or not shape:
        return (flat,)
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(index))


def _diff_chunk(
    ca: bytes | bytearray, cb: bytes | bytearray, width: int, dtype: str
) -> tuple[int, int, float | None]:
    """Count differing elements of two equal-length chunks; context value on the side."""
    import numpy as np

    ra = np.frombuffer(ca, dtype=f"<u{width}")
    rb = np.frombuffer(cb, dtype=f"<u{width}")
    mask = ra != rb
    where = np.flatnonzero(mask)
    diff = _max_abs_diff(ra[mask], rb[mask], dtype)
    return int(where.size), int(where[0]), diff


def _max_abs_diff(ra: np.ndarray, rb: np.ndarray, dtype: str) -> float | None:
    va = as_float(ra, dtype)
    vb = as_float(rb, dtype)
    if va is None or vb is None:
        return None
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(va - vb)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return None
    value = float(d.max())
    return value if math.isfinite(value) else None


def as_float(raw: np.ndarray, dtype: str) -> np.ndarray | None:
    """The values of ``raw`` (unsigned ints of the element width) as float64, where the
    registry says how to read them (context only: never a verdict)."""
    known = DTYPES.get(dtype)
    if known is None or known.kind not in (Kind.FLOAT, Kind.INT, Kind.UINT):
        return None
    if known.numpy is None and top_bits_of(dtype) is None and not is_fp8(dtype):
        return None
    from mtpcheck.mapping.transforms import decode  # numpy: only here

    return decode(raw, dtype)
