"""Property-based fuzzing of the safetensors header parser.

The default run tries a few hundred inputs; ``MTPCHECK_FUZZ_EXAMPLES=10000`` runs the long
campaign (docs/development.md). Whatever the bytes, the parser either returns a header whose
tensors tile the data section, or raises :class:`HeaderError`; no other exception escapes.
"""

from __future__ import annotations

import json
import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpcheck.dtypes import BITS_BY_DTYPE
from mtpcheck.errors import HeaderError
from mtpcheck.formats.safetensors_header import _parse_careful, parse_common, parse_header_bytes

EXAMPLES = int(os.environ.get("MTPCHECK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=8)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
entry = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from(sorted(BITS_BY_DTYPE)), st.text(max_size=6)),
        "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), json_value),
        "data_offsets": st.one_of(
            st.lists(st.integers(-4, 300), min_size=2, max_size=2), json_value
        ),
    }
)
header_obj = st.dictionaries(st.text(max_size=10), st.one_of(entry, json_value), max_size=6)


def _check(prefix: bytes, header: bytes, size: int) -> None:
    try:
        parsed = parse_header_bytes("fuzz.safetensors", prefix, header, size)
    except HeaderError as e:
        assert str(e).startswith("fuzz.safetensors: ")
        return
    spans = sorted((m.offset, m.offset + m.nbytes) for m in parsed.tensors.values())
    position = spans[0][0] if spans else 0
    for begin, end in spans:
        assert begin == position
        position = end


@FUZZ
@given(obj=header_obj, extra=st.integers(0, 64))
def test_structured_headers(obj: dict, extra: int) -> None:
    blob = json.dumps(obj).encode()
    size = 8 + len(blob) + extra
    _check(struct.pack("<Q", len(blob)), blob, size)


@FUZZ
@given(raw=st.binary(max_size=64), length=st.integers(0, 2**64 - 1), size=st.integers(0, 2**40))
def test_arbitrary_bytes(raw: bytes, length: int, size: int) -> None:
    _check(struct.pack("<Q", length), raw, size)


@FUZZ
@given(prefix=st.binary(max_size=9), raw=st.binary(max_size=32))
def test_short_prefix(prefix: bytes, raw: bytes) -> None:
    _check(prefix, raw, len(prefix) + len(raw))


def _text(value: object) -> str:
    """JSON text of ``value``, where a list of pairs is an object (so keys can repeat)."""
    if isinstance(value, PairList):
        return "{" + ",".join(f"{json.dumps(k)}:{_text(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value)


class PairList(list):
    """A JSON object written as its pairs, duplicates kept."""


keys = st.sampled_from(["a", "b", "dtype", "shape", "data_offsets", "__metadata__", "k:1"])


@st.composite
def pair_header(draw: st.DrawFn) -> PairList:
    """A valid header (tensors tiling the data section) with a few random edits: a repeated
    key at either level, a value replaced, pairs reordered, metadata added."""
    width = {"U8": 1, "BF16": 2, "F32": 4}
    obj = PairList()
    position = 0
    for name in draw(
        st.lists(st.sampled_from(["a", "b", "c", "d.e", "f:1"]), max_size=4, unique=True)
    ):
        dtype = draw(st.sampled_from(sorted(width)))
        shape = draw(st.lists(st.integers(0, 3), max_size=2))
        size = width[dtype]
        for d in shape:
            size *= d
        entry = PairList(
            [("dtype", dtype), ("shape", shape), ("data_offsets", [position, position + size])]
        )
        position += size
        obj.append((name, entry))
    if draw(st.booleans()):
        meta = PairList(draw(st.lists(st.tuples(keys, st.text(max_size=2)), max_size=2)))
        obj.insert(draw(st.integers(0, len(obj))), ("__metadata__", meta))
    for _ in range(draw(st.integers(0, 2))):
        target = obj
        if obj and draw(st.booleans()):
            target = draw(st.sampled_from([v for _, v in obj if isinstance(v, PairList)] or [obj]))
        if not target:
            continue
        i = draw(st.integers(0, len(target) - 1))
        edit = draw(st.sampled_from(["repeat", "replace", "swap"]))
        key, value = target[i]
        if edit == "repeat":
            target.insert(draw(st.integers(0, len(target))), (key, draw(json_leaf)))
        elif edit == "replace":
            target[i] = (key, draw(json_leaf))
        else:
            target.insert(0, target.pop(i))
    return obj


@FUZZ
@given(obj=pair_header(), extra=st.integers(0, 24))
def test_fast_parse_agrees_with_the_careful_parse(obj: PairList, extra: int) -> None:
    """Whatever the keys (repeated ones included), the fast parse returns the careful
    parse's header or stands aside; it never accepts what the careful parse refuses."""
    text = _text(obj)
    start = 8 + len(text.encode())
    fast = parse_common("fuzz.safetensors", text, start, start + extra)
    try:
        careful = _parse_careful("fuzz.safetensors", text, start, start + extra)
    except HeaderError:
        assert fast is None
        return
    assert fast is None or fast == careful
