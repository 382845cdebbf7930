"""Reading the fields of a serving engine's answers: each one checked for what it must be, so
an answer of another shape is one line naming the server (exit 2), never an internal error.

A server is input like a file: it may answer ``{"data": 5}`` where a list belongs,
``"completion_tokens": "ten"``, or a counter that is not a number. The parsers in
:mod:`mtpcheck.accept.server_engines` and :mod:`mtpcheck.accept.server_requests` read every
field through :func:`field`, :func:`count` and :func:`counts`, which raise :class:`OddAnswer`;
the caller, which knows the URL, words it as a :class:`~mtpcheck.accept.server_http.ServerError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mtpcheck.errors import RefusedInput, shown

MAX_COUNT = 2**53
"""The largest count mtpcheck takes from a server (a float holds every integer up to it)."""
MAX_ENTRIES = 4096
"""The longest list of counts (a draft histogram holds one entry per draft position)."""


class OddAnswer(RefusedInput):
    """An engine's answer, or a field of it, in a shape mtpcheck cannot read."""


def field(answer: Any, *path: str) -> Any:
    """The value at ``path`` in a JSON answer; :class:`OddAnswer` where it is not there."""
    node = answer
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise OddAnswer(f"answered without {'.'.join(path)}")
        node = node[key]
    return node


def count(value: Any, what: str) -> int:
    """``value`` as a count (a non-negative integer; a float only where it is one)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise OddAnswer(f"{what} is {shown(value)}, not a count")
    return value


def counts(value: Any, what: str) -> list[int]:
    """``value`` as a list of counts, at most :data:`MAX_ENTRIES` long."""
    if not isinstance(value, list) or len(value) > MAX_ENTRIES:
        raise OddAnswer(f"{what} is {shown(value)}, not a list of counts")
    return [count(v, what) for v in value]


def position(label: str, what: str) -> int:
    """A draft position label (``"0"``, ``"1"``, ...) as its number."""
    if not (label.isascii() and label.isdigit() and len(label) <= 6):
        raise OddAnswer(f"{what} has a position label {shown(label)}, not a number")
    return int(label)
