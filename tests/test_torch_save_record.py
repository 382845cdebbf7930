"""Tensor bytes located inside real ``torch.save`` files, without loading them (or torch)."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from mtpcheck.dtypes import safetensors_code
from mtpcheck.formats.torch_save_record import locate_tensor


def _save(obj: object, path: Path, prefix: bytes = b"") -> tuple[int, int]:
    """``obj`` torch.saved after ``prefix`` in ``path`` (as a DCP data file holds chunks)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    blob = buffer.getvalue()
    path.write_bytes(prefix + blob + b"trailing bytes of the next chunk")
    return len(prefix), len(blob)


def _locate(path: Path, start: int, length: int):  # type: ignore[no-untyped-def]
    fd = os.open(path, os.O_RDONLY)
    try:
        return locate_tensor(fd, start, length)
    finally:
        os.close(fd)


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor([[1.5, -0.0], [float("nan"), 3.0]], dtype=torch.bfloat16),
        torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        torch.tensor([0.5, -2.0], dtype=torch.float16),
        torch.tensor([1.0, -448.0], dtype=torch.float8_e4m3fn),
        torch.tensor([1 << 40, -3], dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor(7.25, dtype=torch.float64),
        torch.empty(0, 5, dtype=torch.bfloat16),
    ],
    ids=lambda t: f"{t.dtype}-{list(t.shape)}",
)
def test_located_bytes_are_the_tensors_bytes(tmp_path: Path, tensor: torch.Tensor) -> None:
    path = tmp_path / "chunks.bin"
    start, length = _save(tensor, path, prefix=b"x" * 1261)
    raw = _locate(path, start, length)
    assert raw is not None
    assert raw.dtype == safetensors_code(tensor.dtype)
    assert raw.shape == tuple(tensor.shape)
    with open(path, "rb") as f:
        f.seek(raw.offset)
        assert f.read(raw.nbytes) == _raw(tensor)


def test_a_slice_saved_with_its_whole_storage_is_found_at_its_offset(tmp_path: Path) -> None:
    base = torch.arange(40, dtype=torch.int32)
    path = tmp_path / "slice.pt"
    start, length = _save(base[12:20], path)  # torch.save keeps the 40-element storage
    raw = _locate(path, start, length)
    assert raw is not None and raw.shape == (8,)
    with open(path, "rb") as f:
        f.seek(raw.offset)
        assert f.read(raw.nbytes) == _raw(base[12:20])


@pytest.mark.parametrize(
    "obj",
    [
        torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # strided: not C order
        {"weight": torch.ones(2)},  # a dict, not one tensor
        [torch.ones(2), torch.zeros(2)],
    ],
    ids=["transposed", "dict", "list"],
)
def test_anything_but_a_plain_tensor_is_left_to_assembly(tmp_path: Path, obj: object) -> None:
    path = tmp_path / "other.pt"
    start, length = _save(obj, path)
    assert _locate(path, start, length) is None


def test_malformed_blobs_give_none_not_an_exception(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    start, length = _save(torch.ones(4, dtype=torch.bfloat16), path)
    blob = path.read_bytes()
    for cut in (0, 10, length // 2, length - 1):
        path.write_bytes(blob[: start + cut])
        assert _locate(path, start, cut) is None
    path.write_bytes(b"\0" * 64)
    assert _locate(path, 0, 64) is None
    payload = pickle.dumps(os.system)  # a pickle, not a zip: never unpickled here
    path.write_bytes(payload)
    assert _locate(path, 0, len(payload)) is None


def test_big_endian_record_is_not_located(tmp_path: Path) -> None:
    path = tmp_path / "be.pt"
    start, length = _save(torch.ones(4, dtype=torch.float32), path)
    blob = bytearray(path.read_bytes())
    at = blob.index(b"little", start)
    blob[at : at + 6] = b"bigend"  # same length: the zip stays well-formed
    path.write_bytes(bytes(blob))
    assert _locate(path, start, length) is None


def test_a_foreign_global_in_data_pkl_is_refused_without_running_it(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    path = tmp_path / "evil.pt"
    start, length = _save(Payload(), path)
    assert _locate(path, start, length) is None
    assert not (tmp_path / "pwned").exists()


def test_a_record_written_without_checksums_is_found(tmp_path: Path) -> None:
    """torch writes CRC 0 when asked not to compute checksums (the round trip's intermediate
    checkpoint is written so); zipfile would call every such record corrupt."""
    tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    previous = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        start, length = _save(tensor, tmp_path / "chunks.bin", prefix=b"y" * 77)
    finally:
        torch.serialization.set_crc32_options(previous)
    import zipfile

    blob = (tmp_path / "chunks.bin").read_bytes()[start : start + length]
    assert {info.CRC for info in zipfile.ZipFile(io.BytesIO(blob)).infolist()} == {0}
    raw = _locate(tmp_path / "chunks.bin", start, length)
    assert raw is not None and raw.shape == (3, 4)
    with open(tmp_path / "chunks.bin", "rb") as f:
        f.seek(raw.offset)
        assert f.read(raw.nbytes) == _raw(tensor)
