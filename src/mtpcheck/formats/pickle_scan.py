"""A pickle's opcodes walked once before it is loaded, so what it costs is bounded by its size.

The C unpickler grows its memo table to the largest index a ``PUT`` names: a 13-byte pickle
naming index 2**26 takes a gigabyte before a single object exists. Picklers number their memo
entries from 0 upwards, one per store, so a well-formed pickle never names an index past the
stores before it. :func:`scan` walks the opcodes (their arguments skipped, never decoded) and
refuses an unknown opcode, an argument running past the end, and a memo index past the opcodes
read so far. A loaded pickle's memo then holds at most one slot per byte of it, and its objects
at most a few per byte (every opcode is at least one byte).
"""

from __future__ import annotations

import pickletools

from mtpcheck.errors import RefusedInput

_FIXED, _LINE, _LEN1, _LEN4, _LEN8 = 0, -100, -1, -4, -8


def _argument(op: pickletools.OpcodeInfo) -> int:
    """How an opcode's argument is laid out: a fixed size (0 for none), to the end of a line,
    or a length of 1, 4 or 8 bytes and that many bytes."""
    arg = op.arg
    if arg is None:
        return _FIXED
    if arg.n >= 0:
        return arg.n
    return {
        pickletools.UP_TO_NEWLINE: _LINE,
        pickletools.TAKEN_FROM_ARGUMENT1: _LEN1,
        pickletools.TAKEN_FROM_ARGUMENT4: _LEN4,
        pickletools.TAKEN_FROM_ARGUMENT4U: _LEN4,
        pickletools.TAKEN_FROM_ARGUMENT8U: _LEN8,
    }[arg.n]


_MEMO = 1000
"""Added to the argument size of the opcodes that store into the memo at an index they name."""
_LAYOUT: list[int | None] = [None] * 256
for _op in pickletools.opcodes:
    _LAYOUT[ord(_op.code)] = _argument(_op)
_LAYOUT[ord("q")] += _MEMO  # type: ignore[operator]  # BINPUT: a 1-byte index
_LAYOUT[ord("r")] += _MEMO  # type: ignore[operator]  # LONG_BINPUT: a 4-byte index
_GLOBAL, _PUT = ord("c"), ord("p")


class UnsafePickle(RefusedInput):
    """A pickle whose opcodes would cost more than its size allows, or are malformed."""


def scan(data: bytes | memoryview) -> int:
    """Walk ``data``'s opcodes; returns how many there are. :class:`UnsafePickle` for an
    unknown opcode, a cut-off argument, or a memo index past the opcodes before it."""
    layout, end, at, ops = _LAYOUT, len(data), 0, 0
    while at < end:
        code = data[at]
        kind = layout[code]
        at += 1
        ops += 1
        if kind is None:
            raise UnsafePickle(f"unknown opcode {code:#04x} at byte {at - 1}")
        if 0 <= kind < _MEMO:
            at += kind
        elif kind > _MEMO:  # BINPUT, LONG_BINPUT
            width = kind - _MEMO
            index = int.from_bytes(data[at : at + width], "little")
            if index > ops:
                raise UnsafePickle(f"memo index {index} after {ops} opcodes")
            at += width
        elif kind == _LINE:
            start = at
            at = _line_end(data, at, end)
            if code == _GLOBAL:
                at = _line_end(data, at, end)
            elif code == _PUT and _index_past(data[start : at - 1], ops):
                raise UnsafePickle(f"memo index past the {ops} opcodes before it")
        else:
            width = -kind
            at += width + int.from_bytes(data[at : at + width], "little")
    if at > end:
        raise UnsafePickle("the last opcode's argument runs past the end")
    return ops


def _line_end(data: bytes | memoryview, at: int, end: int) -> int:
    """The position after the newline ending the line at ``at``."""
    found = bytes(data[at : min(end, at + 4096)]).find(b"\n")
    if found < 0:
        raise UnsafePickle(f"a text argument at byte {at} without its newline")
    return at + found + 1


def _index_past(text: bytes | memoryview, ops: int) -> bool:
    digits = bytes(text)
    return not digits.isdigit() or len(digits) > 12 or int(digits) > ops
