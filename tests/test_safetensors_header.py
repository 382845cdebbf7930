"""The safetensors header parser accepts valid headers and names the fault in bad ones."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from mtpcheck.errors import HeaderError
from mtpcheck.formats.safetensors_header import read_header
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
