"""Progress of long tensor comparisons: plain lines on stderr, at most one every few seconds.

A comparison of a 700 GB checkpoint runs for an hour; in a CI log it must not be silent. The
pairs are compared in batches of about :data:`BATCH_BYTES` and, at most every :data:`INTERVAL`
seconds, one line says how far it got: bytes done of the total, rate, time left, the tensor it
is at. Runs shorter than the interval print nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from mtpcheck.checks.diff_checks import Compare
from mtpcheck.model import Checkpoint, TensorComparison
from mtpcheck.units import human_duration, human_size

BATCH_BYTES = 256 * 2**20
INTERVAL = 5.0


def _pair_bytes(a: Checkpoint, b: Checkpoint, pair: tuple[str, str]) -> int:
    ma, mb = a.tensors.get(pair[0]), b.tensors.get(pair[1])
    return max(ma.nbytes if ma else 0, mb.nbytes if mb else 0)


def _batches(
    a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
) -> list[tuple[list[tuple[str, str]], int]]:
    batches: list[tuple[list[tuple[str, str]], int]] = []
    current: list[tuple[str, str]] = []
    held = 0
    for pair in pairs:
        current.append(pair)
        held += _pair_bytes(a, b, pair)
        if held >= BATCH_BYTES:
            batches.append((current, held))
            current, held = [], 0
    if current:
        batches.append((current, held))
    return batches


def with_progress(
    compare: Compare,
    label: str,
    log: Callable[[str], None],
    interval: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Compare:
    """``compare`` that reports how far it got through ``log``."""
    every = INTERVAL if interval is None else interval

    def run(
        a: Checkpoint, b: Checkpoint, pairs: Sequence[tuple[str, str]]
    ) -> list[TensorComparison]:
        batches = _batches(a, b, pairs)
        total = sum(n for _, n in batches)
        start = last = clock()
        done = 0
        spoke = False
        results: list[TensorComparison] = []
        for batch, nbytes in batches:
            results += compare(a, b, batch)
            done += nbytes
            now = clock()
            if now - last >= every and done < total:
                rate = done / max(now - start, 1e-9)
                left = (total - done) / rate if rate else 0.0
                share = f"{human_size(done)} of {human_size(total)} ({100 * done / total:.0f}%)"
                log(
                    f"{label}: {share}, {human_size(rate)}/s, "
                    f"about {human_duration(left)} left, at {batch[-1][0]}"
                )
                last, spoke = now, True
        elapsed = clock() - start
        if spoke or elapsed >= every:
            log(
                f"{label}: {len(pairs)} tensors, {human_size(total)} in {human_duration(elapsed)} "
                f"({human_size(total / max(elapsed, 1e-9))}/s)"
            )
        return results

    return run
