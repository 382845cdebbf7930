"""The safetensors header parser accepts valid headers and names the fault in bad ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from mtpcheck.errors import HeaderError
from mtpcheck.formats.safetensors_header import (
    ShardHeader,
    _parse_careful,
    parse_common,
    parse_header_bytes,
    read_header,
)
from mtpcheck.model import TensorTable, files_of, total_nbytes
from tests.conftest import write_safetensors


def _raw(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    blob = json.dumps(header).encode() if not isinstance(header, bytes) else header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob) if length is None else length))
        f.write(blob)
        f.write(data)
    return path


def test_valid_header_lists_tensors_with_absolute_offsets(tmp_path: Path) -> None:
    p = tmp_path / "ok.safetensors"
    write_safetensors(p, {"a": ("BF16", [2, 2], b"\x01" * 8), "b": ("F32", [1], b"\x02" * 4)})
    h = read_header(str(p))
    assert set(h.tensors) == {"a", "b"}
    a = h.tensors["a"]
    assert (a.dtype, a.shape, a.nbytes) == ("BF16", (2, 2), 8)
    with open(p, "rb") as f:
        f.seek(a.offset)
        assert f.read(8) == b"\x01" * 8
    assert not h.truncated and h.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    ("header", "data", "length", "reason"),
    [
        (
            {"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}},
            b"xx",
            0,
            "header length is 0",
        ),
        ({}, b"", 1 << 62, "exceeds the 100000000-byte limit"),
        ({}, b"", 5000, "runs past the end"),
        (b"\xff\xfe{}", b"", None, "not UTF-8"),
        (b"{not json", b"", None, "not valid JSON"),
        ([1, 2], b"", None, "header is JSON list, expected an object"),
        ({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"x", None, "unknown dtype"),
        (
            {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}},
            b"xxxx",
            None,
            "needs 6 bytes but data_offsets span 4",
        ),
        (
            {"a": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}},
            b"xx",
            None,
            "is not a list of sizes",
        ),
        (
            {"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}},
            b"xx",
            None,
            "are not [begin, end]",
        ),
        (
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"xxx",
            None,
            "overlaps",
        ),
        (
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
            },
            b"x" * 6,
            None,
            "2-byte hole",
        ),
        (
            b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
            b"x",
            None,
            "duplicate tensor name 'a'",
        ),
        ({"a": "nope"}, b"", None, "entry is not an object"),
        (
            {"a": {"dtype": "U8", "shape": [2**62], "data_offsets": [0, 2**62]}},
            b"x",
            None,
            f"data_offsets declare {2**62} bytes, more than a file holds",
        ),
    ],
)
def test_malformed_headers_raise_with_the_reason(
    tmp_path: Path, header: object, data: bytes, length: int | None, reason: str
) -> None:
    p = _raw(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(HeaderError) as err:
        read_header(str(p))
    assert reason in str(err.value)
    assert str(err.value).startswith(str(p) + ": ")


def test_too_short_and_empty_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(HeaderError, match="0 bytes, too short"):
        read_header(str(empty))


def test_truncated_data_marks_tensors_unreadable(tmp_path: Path) -> None:
    p = tmp_path / "t.safetensors"
    write_safetensors(p, {"a": ("U8", [4], b"aaaa"), "b": ("U8", [4], b"bbbb")})
    p.write_bytes(p.read_bytes()[:-2])
    h = read_header(str(p))
    assert h.truncated
    assert (h.data_bytes_declared, h.data_bytes_on_disk) == (8, 6)
    assert h.tensors["a"].readable and not h.tensors["b"].readable


def _both(text: str, data_bytes: int) -> tuple[object, object]:
    """(fast parse, careful parse) of ``text`` for a file with ``data_bytes`` after it."""
    size = 8 + len(text.encode()) + data_bytes
    fast = parse_common("f.safetensors", text, 8 + len(text.encode()), size)
    try:
        careful: object = _parse_careful("f.safetensors", text, 8 + len(text.encode()), size)
    except HeaderError as e:
        careful = e
    return fast, careful


ENTRY = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'


@pytest.mark.parametrize(
    "text",
    [
        # a duplicate whose first value is not an entry: a dict keeps the valid last one
        '{"a":5,"a":' + ENTRY + "}",
        '{"a":' + ENTRY.replace('"dtype":"U8"', '"dtype":"F32","dtype":"U8"') + "}",
        '{"a":' + ENTRY.replace('"shape":[1]', '"shape":"x","shape":[1]') + "}",
        '{"__metadata__":{"k":"1","k":"2"},"a":' + ENTRY + "}",
        # escapes can spell a key so no substring search sees it
        '{"a":' + ENTRY.replace('"dtype":"U8"', '"\\u0064type":"F32","dtype":"U8"') + "}",
        '{"\\u0061":5,"a":' + ENTRY + "}",
    ],
)
def test_duplicate_keys_are_never_accepted_fast(text: str) -> None:
    fast, careful = _both(text, 1)
    assert fast is None
    assert isinstance(careful, HeaderError) and "duplicate" in str(careful)


@pytest.mark.parametrize(
    "text",
    [
        # values JSON holds but the typed decoder refuses or reads otherwise
        '{"a":' + ENTRY.replace("[1]", "[true]") + "}",
        '{"a":' + ENTRY.replace("[1]", "[1.0]") + "}",
        '{"a":' + ENTRY.replace("[1]", "[-1]") + "}",
        '{"a":' + ENTRY.replace("[0,1]", "[0,1,1]") + "}",
        '{"a":' + ENTRY.replace("[0,1]", f"[{2**64},{2**64 + 1}]") + "}",
        '{"a":' + ENTRY.replace('"U8"', "5") + "}",
        '{"a":' + ENTRY.replace('"U8"', '"Q4_K"') + "}",
        '{"a":' + ENTRY.replace('"shape":[1],', "") + "}",
        # keys the typed decoder skips: counted by their colons
        '{"a":' + ENTRY.replace("}", ',"x":1}') + "}",
        '{"a":' + ENTRY.replace("}", ',"x":{"y":2}}') + "}",
        # __metadata__ in the forms the careful parse takes or refuses
        '{"__metadata__":null,"a":' + ENTRY + "}",
        '{"__metadata__":{"k":5},"a":' + ENTRY + "}",
        '{"__metadata__":{"k":{"j":"1"}},"a":' + ENTRY + "}",
        '{"__metadata__":' + ENTRY + "}",
        '{"a":' + ENTRY + ',"__metadata__":{"k":"v"},"__metadata__":{}}',
    ],
)
def test_the_typed_decoder_stands_aside_for_the_careful_parse(text: str) -> None:
    fast, careful = _both(text, 1)
    assert fast is None
    blob = text.encode()
    try:
        whole: object = parse_header_bytes(
            "f.safetensors", struct.pack("<Q", len(blob)), blob, 8 + len(blob) + 1
        )
    except HeaderError as e:
        whole = e
    assert type(whole) is type(careful)
    assert whole == careful if isinstance(careful, ShardHeader) else str(whole) == str(careful)


@pytest.mark.parametrize(
    "metadata", ['"__metadata__":{},', '"__metadata__":{"format":"pt","k":"v"},', ""]
)
def test_the_typed_decoder_takes_the_usual_header(metadata: str) -> None:
    """What safetensors writers write (``__metadata__`` first, last or not at all) is parsed
    by the fast path, to the careful parse's header."""
    entries = ('"b":' + ENTRY, '"c":' + ENTRY.replace("[0,1]", "[1,2]"))
    for text in (
        "{" + metadata + ",".join(entries) + "}",
        "{" + ",".join(entries) + ("," + metadata.rstrip(",") if metadata else "") + "}",
    ):
        fast, careful = _both(text, 2)
        assert isinstance(fast, ShardHeader)
        assert fast == careful
        assert fast.metadata == json.loads(text).get("__metadata__", {})


def test_fast_and_careful_parse_agree_on_usual_headers() -> None:
    header = {
        "__metadata__": {"format": "pt"},
        "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [4, 16]},
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},  # not in offset order
        "z": {"dtype": "U8", "shape": [0], "data_offsets": [16, 16]},
    }
    fast, careful = _both(json.dumps(header, separators=(",", ":")), 16)
    assert isinstance(fast, ShardHeader) and fast == careful
    assert list(fast.tensors) == ["b", "a", "z"]  # header order
    assert (
        fast.tensors["b"].shape == (2, 3)
        and fast.tensors["b"].offset == fast.tensors["a"].offset + 4
    )
    # a colon inside a string, a backslash, spaces, or other key orders: the careful parse
    for variant in (
        {**header, "__metadata__": {"format": "pt:1"}},
        {**header, "__metadata__": {"format": "p\\t"}},
        {k: dict(reversed(v.items())) for k, v in header.items()},
    ):
        text = json.dumps(variant, separators=(",", ":"))
        fast, careful = _both(text, 16)
        assert isinstance(careful, ShardHeader)
        assert fast is None or fast == careful
    fast, careful = _both(json.dumps(header), 16)  # spaces after ':' and ','
    assert fast == careful


def _table(*parts: dict[str, tuple[str, list[int], bytes]]) -> tuple[TensorTable | None, list]:
    headers = []
    for i, tensors in enumerate(parts):
        blob = json.dumps(
            {
                n: {"dtype": d, "shape": s, "data_offsets": [0, len(b)]}
                for n, (d, s, b) in tensors.items()
            }
        ).encode()
        size = 8 + len(blob) + sum(len(b) for _, _, b in tensors.values())
        headers.append(parse_header_bytes(f"s{i}", struct.pack("<Q", len(blob)), blob, size))
    return TensorTable.of(h.columns for h in headers), headers


def test_tensor_table_is_the_merged_mapping_in_name_order() -> None:
    table, headers = _table(
        {"m.2": ("U8", [2], b"xx")}, {"m.10": ("BF16", [1], b"yy"), "a": ("U8", [0], b"")}
    )
    assert table is not None
    merged = {**headers[0].tensors, **headers[1].tensors}
    assert list(table) == sorted(merged) == ["a", "m.10", "m.2"]
    assert table == merged and len(table) == 3
    assert table["m.10"] == headers[1].tensors["m.10"] and table["m.10"].file == "s1"
    assert "m.2" in table and "m.3" not in table and table.get("m.3") is None
    with pytest.raises(KeyError):
        table["m.3"]
    assert total_nbytes(table) == total_nbytes(merged) == 4
    assert files_of(table) == files_of(merged) == {"s0", "s1"}


def test_tensor_table_refuses_a_name_in_two_files() -> None:
    table, _ = _table({"w": ("U8", [1], b"x")}, {"w": ("U8", [1], b"y")})
    assert table is None


def test_the_fast_parse_reads_bytes_and_text_alike() -> None:
    """The usual header is parsed from its bytes (no decoding first); a name beyond ASCII is
    decoded as UTF-8 by the typed decoder, to the careful parse's header."""
    text = '{"__metadata__":{"format":"pt"},"né":' + ENTRY + "}"
    blob = text.encode()
    whole = parse_header_bytes("f.safetensors", struct.pack("<Q", len(blob)), blob, len(blob) + 9)
    fast, careful = _both(text, 1)
    assert whole == fast == careful
    assert parse_common("f.safetensors", blob, 8 + len(blob), len(blob) + 9) == fast
    assert list(whole.tensors) == ["né"] and whole.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    ("metadata", "fast_takes_it"),
    [
        ('{"k":"a}b"}', True),  # the first brace inside a string: the slice refused, all read
        ('{"k":"v","k":"w"}', False),  # a repeated key: the colon count refuses it
        ('{"k":5}', False),  # not a string: left to the careful parse (which words it as "5")
        ("{}", True),
    ],
)
def test_metadata_first_is_decoded_from_its_own_bytes(metadata: str, fast_takes_it: bool) -> None:
    """``__metadata__`` opening the header is decoded from its slice up to the first ``}``;
    wherever that slice is not the object, the fast parse still gives the careful parse's
    header, or stands aside."""
    text = '{"__metadata__":' + metadata + ',"a":' + ENTRY + "}"
    fast, careful = _both(text, 1)
    if not fast_takes_it:
        assert fast is None
        return
    assert isinstance(fast, ShardHeader) and fast == careful
    assert fast.metadata == json.loads(metadata)
