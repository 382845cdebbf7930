"""Every ``MTPCHECK_*`` environment variable mtpcheck reads, in one table: its name, how its
value is read, its default and what it does. One policy for all: unset or empty means the
default; a value that does not parse is refused in one line naming the variable (exit 2),
never silently replaced by the default. ``docs/commands/options.md``'s table is generated
from :data:`SETTINGS`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from mtpcheck.errors import MtpcheckError

T = TypeVar("T")


class SettingError(MtpcheckError):
    """An ``MTPCHECK_*`` variable holds a value that does not parse (exit 2)."""


def _number(raw: str, kind: Callable[[str], T], what: str) -> T:
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"not {what}") from None


def positive_int(raw: str) -> int:
    """An integer of at least 1."""
    value = _number(raw, int, "a positive integer")
    if value < 1:
        raise ValueError("not a positive integer")
    return value


def threads_or_auto(raw: str) -> int | None:
    """A positive integer, or ``auto`` (None: one per CPU the process may use)."""
    if raw.lower() == "auto":
        return None
    try:
        return positive_int(raw)
    except ValueError:
        raise ValueError("neither a positive integer nor 'auto'") from None


def seconds(raw: str) -> float:
    """A finite number of seconds, 0 or more."""
    value = _number(raw, float, "a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise ValueError("not a finite number of seconds, 0 or more")
    return value


def positive_seconds(raw: str) -> float:
    """A finite number of seconds above 0."""
    value = seconds(raw)
    if value == 0:
        raise ValueError("not a number of seconds above 0")
    return value


def path(raw: str) -> Path:
    """A file system path, as given."""
    return Path(raw)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable."""

    name: str
    parse: Callable[[str], T]
    """Reads a set, non-empty value; raises ValueError saying what the value is not."""
    default: T | None
    shown_default: str
    """The default in words, for the docs."""
    doc: str
    """What it does, one sentence."""

    def value(self, environ: Mapping[str, str] | None = None) -> T | None:
        """The variable's value, or the default where it is unset or empty; a
        :class:`SettingError` where it does not parse."""
        raw = (os.environ if environ is None else environ).get(self.name, "").strip()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise SettingError(f"{self.name}={raw!r}: {e}") from None

    def given(self, environ: Mapping[str, str] | None = None) -> T:
        """:meth:`value`, for a variable that has a default (never None)."""
        found = self.value(environ)
        if found is None:
            raise TypeError(f"{self.name} has no default to fall back to")
        return found


THREADS: Setting[int] = Setting(
    "MTPCHECK_THREADS",
    positive_int,
    4,
    "4",
    "Threads that compare tensor bytes in `diff` and the round trip's checks.",
)
TORCH_THREADS: Setting[int | None] = Setting(
    "MTPCHECK_TORCH_THREADS",
    threads_or_auto,
    None,
    "1 (or `OMP_NUM_THREADS`'s count where that is set)",
    "Torch's CPU threads for `accept` and the converters: a number, or `auto` for one per CPU "
    "the process may use.",
)
PROGRESS_INTERVAL: Setting[float] = Setting(
    "MTPCHECK_PROGRESS_INTERVAL",
    seconds,
    5.0,
    "5",
    "Seconds between progress lines on stderr.",
)
DIST_TIMEOUT: Setting[float] = Setting(
    "MTPCHECK_DIST_TIMEOUT",
    positive_seconds,
    4 * 3600.0,
    "14400 (4 hours)",
    "Seconds a torchrun rank waits for the others at a collective.",
)
TIMINGS: Setting[Path] = Setting(
    "MTPCHECK_TIMINGS",
    path,
    None,
    "unset: not written",
    "A file `roundtrip` writes the time of each of its parts to (JSON).",
)
VLLM_VENV: Setting[Path] = Setting(
    "MTPCHECK_VLLM_VENV",
    path,
    None,
    "unset: mtpcheck's own interpreter",
    "A venv whose `bin/python` runs vLLM for `accept --engine vllm` (vLLM's pins often need a "
    "venv of their own).",
)

SETTINGS: tuple[Setting[object], ...] = (  # type: ignore[assignment]
    THREADS,
    TORCH_THREADS,
    PROGRESS_INTERVAL,
    DIST_TIMEOUT,
    TIMINGS,
    VLLM_VENV,
)
"""Every variable, in the order the docs list them."""
