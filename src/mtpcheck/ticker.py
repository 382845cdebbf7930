"""A progress line at most every few seconds: bytes done of the total, rate, time left (leaf).

Long work (comparing or converting hundreds of GB) reports through a :class:`Ticker`; work
shorter than the interval prints nothing, so small runs stay quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mtpcheck.units import human_duration, human_size

INTERVAL = 5.0


class Ticker:
    """Counts bytes done of ``total`` and says so through ``emit`` every ``interval`` s."""

    def __init__(
        self,
        label: str,
        total: int,
        emit: Callable[[str], None],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.emit, self.clock = label, total, emit, clock
        self.interval = INTERVAL if interval is None else interval
        self.start = self.last = clock()
        self.done = 0
        self.spoke = False

    def advance(self, nbytes: int, at: str) -> None:
        """``nbytes`` more are done; ``at`` names what the work reached."""
        self.done += nbytes
        now = self.clock()
        if now - self.last < self.interval or self.done >= self.total:
            return
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        share = f"{human_size(self.done)} of {human_size(self.total)}"
        self.emit(
            f"{self.label}: {share} ({100 * self.done / self.total:.0f}%), "
            f"{human_size(rate)}/s, about {human_duration(left)} left, at {at}"
        )
        self.last, self.spoke = now, True

    def finish(self, what: str) -> None:
        """The closing line (``what`` was done), if the work was long enough to report."""
        elapsed = self.clock() - self.start
        if self.spoke or elapsed >= self.interval:
            self.emit(
                f"{self.label}: {what}, {human_size(self.total)} in {human_duration(elapsed)} "
                f"({human_size(self.total / max(elapsed, 1e-9))}/s)"
            )
