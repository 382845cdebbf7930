"""Sizes, durations and long lists as people read them (leaf module)."""

from __future__ import annotations

from collections.abc import Sequence


def human_size(nbytes: float) -> str:
    """``1.02 GiB``, ``512.00 KiB``, ``80 bytes``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} bytes"


def human_duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``1.2 h``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def first_few(items: Sequence[object], shown: int, *, counted: bool = True) -> str:
    """The first ``shown`` of ``items`` in a message: ``a, b, c and 4 more``, or ``a, b, c ...``
    where the message gives the count itself (not ``counted``)."""
    head = ", ".join(map(str, items[:shown]))
    if len(items) <= shown:
        return head
    return f"{head} and {len(items) - shown} more" if counted else f"{head} ..."
