"""``torch.save`` files read without torch: every tensor's elements are the bytes torch holds.

The files are written by torch itself; mtpcheck's loader (no torch import, see
test_megatron_readers' run without torch) must give, for each tensor, exactly the raw bytes of
``tensor.contiguous()``, whatever the dtype, the strides or how the zip stores the record.
"""

from __future__ import annotations

import argparse
import io
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from mtpcheck.errors import InputError
from mtpcheck.formats.safe_pickle import load_torch_file
from mtpcheck.formats.torch_pickle import StoredTensor, TorchDType


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _elements(t: StoredTensor) -> bytes:
    return np.ascontiguousarray(t.elements()).tobytes()


TENSORS = {
    "bf16-nan-negzero": torch.tensor([[1.5, -0.0], [float("nan"), 3.0]], dtype=torch.bfloat16),
    "f32-3d": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
    "f8-e4m3": torch.tensor([1.0, -448.0], dtype=torch.float8_e4m3fn),
    "f8-e5m2": torch.tensor([0.5, -2.0], dtype=torch.float8_e5m2),
    "i64": torch.tensor([1 << 40, -3], dtype=torch.int64),
    "bool": torch.tensor([True, False, True]),
    "f64-scalar": torch.tensor(7.25, dtype=torch.float64),
    "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
    "empty": torch.empty(0, 5, dtype=torch.bfloat16),
    "transposed": torch.arange(12, dtype=torch.float16).reshape(3, 4).t(),
    "slice-of-storage": torch.arange(40, dtype=torch.int32)[12:20],
    "every-other-row": torch.arange(30, dtype=torch.bfloat16).reshape(6, 5)[::2],
}


@pytest.mark.parametrize("name", sorted(TENSORS))
def test_each_tensor_reads_as_torch_holds_it(tmp_path: Path, name: str) -> None:
    tensor = TENSORS[name]
    torch.save({"t": tensor, "p": torch.nn.Parameter(tensor.float() if tensor.is_complex() else
                                                      tensor.clone(), requires_grad=False)},
               tmp_path / "f.pt")  # fmt: skip
    loaded = load_torch_file(tmp_path / "f.pt")
    stored = loaded["t"]
    assert isinstance(stored, StoredTensor)
    assert stored.shape == tuple(tensor.shape)
    assert stored.dtype == {torch.bool: "BOOL"}.get(tensor.dtype, stored.dtype)
    assert _elements(stored) == _raw(tensor)
    assert isinstance(loaded["p"], StoredTensor)  # a Parameter is its data


def test_tensors_sharing_a_storage_read_their_own_parts(tmp_path: Path) -> None:
    base = torch.arange(20, dtype=torch.bfloat16)
    torch.save(OrderedDict(a=base[:10], b=base[10:].view(2, 5)), tmp_path / "f.pt")
    loaded = load_torch_file(tmp_path / "f.pt")
    assert type(loaded) is OrderedDict
    assert _elements(loaded["a"]) == _raw(base[:10])
    assert _elements(loaded["b"]) == _raw(base[10:])


def test_megatron_args_keep_their_dtypes_as_stand_ins(tmp_path: Path) -> None:
    args = argparse.Namespace(params_dtype=torch.bfloat16, num_layers=2, device=torch.device("cpu"))
    torch.save({"args": args}, tmp_path / "f.pt")
    loaded = load_torch_file(tmp_path / "f.pt")["args"]
    assert loaded.params_dtype == TorchDType("bfloat16")
    assert (loaded.params_dtype.code, loaded.params_dtype.itemsize) == ("BF16", 2)
    assert str(loaded.params_dtype) == str(torch.bfloat16)
    assert (loaded.num_layers, str(loaded.device)) == (2, "torch.cpu")


def test_a_compressed_record_is_read_by_decompressing_it(tmp_path: Path) -> None:
    tensor = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    torch.save({"t": tensor}, tmp_path / "f.pt")
    out = io.BytesIO()  # the same archive with every record deflated (torch never does)
    with zipfile.ZipFile(io.BytesIO((tmp_path / "f.pt").read_bytes())) as src:
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info))
    (tmp_path / "f.pt").write_bytes(out.getvalue())
    assert _elements(load_torch_file(tmp_path / "f.pt")["t"]) == _raw(tensor)


def _rewritten(path: Path, change: Callable[[str, bytes], tuple[str, bytes]]) -> None:
    """The archive with each record's name and bytes passed through ``change``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(*change(info.filename, src.read(info)))
    path.write_bytes(out.getvalue())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda name, data: (name.replace("/data/0", "/data/9"), data), "storage 0 has no record"),
        (
            lambda name, data: (name, data[:-4] if "/data/" in name else data),
            "storage 0 holds 3996 bytes, not 4000",
        ),
    ],
    ids=["record-missing", "record-short"],
)
def test_a_storage_without_its_bytes_is_one_error_when_loaded(
    tmp_path: Path, change: Callable[[str, bytes], tuple[str, bytes]], reason: str
) -> None:
    torch.save({"t": torch.ones(1000)}, tmp_path / "f.pt")
    _rewritten(tmp_path / "f.pt", change)
    with pytest.raises(InputError) as e:
        load_torch_file(tmp_path / "f.pt")
    assert (e.value.path, e.value.reason) == (
        str(tmp_path / "f.pt"),
        f"unreadable torch.save file ({reason})",
    )


def test_a_file_from_before_torch_1_6_is_refused_in_one_line(tmp_path: Path) -> None:
    torch.save({"t": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(InputError) as e:
        load_torch_file(tmp_path / "old.pt")
    assert e.value.reason == (
        "unreadable torch.save file (not a zip archive (torch.save files from before torch 1.6 "
        "are not read))"
    )
