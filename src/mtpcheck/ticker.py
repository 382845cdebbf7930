"""A progress line at most every few seconds: bytes done of the total, rate, time left (leaf).

Long work (comparing or converting hundreds of GB) reports through a :class:`Ticker`; work
shorter than the interval prints nothing, so small runs stay quiet. When the line sink can also
draw a live bar (:class:`LiveSink`, the CLI's when stderr is a terminal), the ticker moves the
bar on every step instead of printing lines, and prints only the closing line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from mtpcheck.settings import PROGRESS_INTERVAL
from mtpcheck.units import human_duration, human_size


def default_interval() -> float:
    """Seconds between progress lines: ``MTPCHECK_PROGRESS_INTERVAL``
    (:data:`mtpcheck.settings.PROGRESS_INTERVAL`, default 5)."""
    return PROGRESS_INTERVAL.given()


class LiveBar(Protocol):
    """A bar drawn in place: ``done`` of the total, the item the work is at."""

    def update(self, done: int, at: str) -> None:
        """Move the bar to ``done`` of the total, working at ``at``."""
        ...

    def close(self) -> None:
        """Take the bar off the screen."""
        ...


@runtime_checkable
class LiveSink(Protocol):
    """A line sink that can also draw a live bar."""

    def __call__(self, line: str) -> None: ...

    def live(self, label: str, total: int, unit: str = "") -> LiveBar | None:
        """A bar for work of ``total`` (bytes, or ``unit``); None when none can be drawn."""
        ...


def _amount(n: float, unit: str) -> str:
    return human_size(n) if not unit else f"{n:,.0f} {unit}"


class Ticker:
    """Counts work done of ``total`` and says so through ``emit`` every ``interval`` s.

    The work is counted in bytes, or in ``unit`` (e.g. ``"tokens"``) where one is given.
    """

    def __init__(
        self,
        label: str,
        total: int,
        emit: Callable[[str], None],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        unit: str = "",
    ) -> None:
        self.label, self.total, self.emit, self.clock, self.unit = label, total, emit, clock, unit
        self.interval = default_interval() if interval is None else interval
        self.start = self.last = clock()
        self.done = 0
        self.spoke = False
        self.bar = emit.live(label, total, unit) if isinstance(emit, LiveSink) else None

    def advance(self, nbytes: int, at: str) -> None:
        """``nbytes`` more are done; ``at`` names what the work reached."""
        self.done += nbytes
        if self.bar is not None:
            self.bar.update(self.done, at)
            return
        now = self.clock()
        if now - self.last < self.interval or not 0 < self.done < self.total:
            return  # nothing done yet: no rate to tell
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        share = f"{_amount(self.done, self.unit)} of {_amount(self.total, self.unit)}"
        self.emit(
            f"{self.label}: {share} ({100 * self.done / self.total:.0f}%), "
            f"{_amount(rate, self.unit)}/s, about {human_duration(left)} left, at {at}"
        )
        self.last, self.spoke = now, True

    def finish(self, what: str) -> None:
        """The closing line (``what`` was done), if the work was long enough to report."""
        if self.bar is not None:
            self.bar.close()
        elapsed = self.clock() - self.start
        if self.spoke or elapsed >= self.interval:
            rate = _amount(self.total / max(elapsed, 1e-9), self.unit)
            self.emit(
                f"{self.label}: {what}, {_amount(self.total, self.unit)} in "
                f"{human_duration(elapsed)} ({rate}/s)"
            )
