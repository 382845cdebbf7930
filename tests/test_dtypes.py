"""The dtype registry agrees with torch and numpy, the libraries whose names it records."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtpcheck.checks.tensor_match import _as_float
from mtpcheck.dtypes import BY_STORAGE, BY_TORCH, DTYPES, Kind, is_fp8, itemsize, safetensors_code


@pytest.mark.parametrize("code", sorted(c for c, d in DTYPES.items() if d.torch))
def test_torch_names_are_real_torch_dtypes_of_that_width(code: str) -> None:
    dtype = DTYPES[code]
    real = getattr(torch, dtype.torch)
    assert isinstance(real, torch.dtype)
    assert real.itemsize * 8 == dtype.bits
    assert real.is_floating_point == (dtype.kind is Kind.FLOAT)
    assert real.is_complex == (dtype.kind is Kind.COMPLEX)
    assert safetensors_code(real) == code


@pytest.mark.parametrize("code", sorted(c for c, d in DTYPES.items() if d.numpy))
def test_numpy_names_have_that_width(code: str) -> None:
    assert np.dtype(DTYPES[code].numpy).itemsize * 8 == DTYPES[code].bits


def test_storage_classes_are_torchs_and_of_their_dtype() -> None:
    for name, dtype in BY_STORAGE.items():
        storage = getattr(torch, name)
        assert storage.dtype == getattr(torch, dtype.torch), name


@pytest.mark.parametrize("code", ["F8_E4M3", "F8_E5M2"])
def test_fp8_decoding_matches_torch_for_all_256_codes(code: str) -> None:
    raw = np.arange(256, dtype=np.uint8)
    ours = _as_float(raw, code)
    theirs = torch.from_numpy(raw.copy()).view(getattr(torch, DTYPES[code].torch)).double()
    assert ours is not None
    for a, b in zip(ours.tolist(), theirs.tolist(), strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == b


def test_bf16_decoding_matches_torch() -> None:
    raw = np.arange(0, 65536, 7, dtype=np.uint16)
    ours = _as_float(raw, "BF16")
    theirs = torch.from_numpy(raw.copy()).view(torch.bfloat16).double().numpy()
    assert ours is not None
    assert np.array_equal(ours, theirs, equal_nan=True)


def test_itemsize_and_fp8() -> None:
    assert (itemsize("BF16"), itemsize("F8_E4M3"), itemsize("F4"), itemsize("F6_E2M3")) == (
        2,
        1,
        None,
        None,
    )
    assert [c for c in DTYPES if is_fp8(c)] == ["F8_E5M2", "F8_E4M3"]  # not the E8M0 scales
    with pytest.raises(KeyError):
        itemsize("Q4_K")
    assert safetensors_code(torch.float8_e4m3fn) == "F8_E4M3"
    assert set(BY_TORCH) >= {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float32"}
