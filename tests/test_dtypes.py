"""The dtype registry agrees with torch and numpy, the libraries whose names it records."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mtpcheck.checks.tensor_match import as_float
from mtpcheck.dtypes import (
    BITS_BY_DTYPE,
    BY_STORAGE,
    BY_TORCH,
    DTYPES,
    Kind,
    is_fp8,
    is_high_precision,
    itemsize,
    safetensors_code,
)
from tests.thirdparty.tools import require


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
    ours = as_float(raw, code)
    theirs = torch.from_numpy(raw.copy()).view(getattr(torch, DTYPES[code].torch)).double()
    assert ours is not None
    for a, b in zip(ours.tolist(), theirs.tolist(), strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == b


def test_bf16_decoding_matches_torch() -> None:
    raw = np.arange(0, 65536, 7, dtype=np.uint16)
    ours = as_float(raw, "BF16")
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
    assert itemsize("Q4_K") is None  # a block type: no element has a width
    assert itemsize("torch.foo") is None  # a torch dtype the registry does not know
    assert safetensors_code(torch.float8_e4m3fn) == "F8_E4M3"
    assert set(BY_TORCH) >= {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float32"}


BLOCK_TYPES = sorted(c for c, d in DTYPES.items() if d.kind is Kind.BLOCK)


@pytest.mark.parametrize("code", BLOCK_TYPES)
def test_block_types_have_ggmls_block_sizes(code: str) -> None:
    require("gguf")
    import gguf

    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[code]]
    dtype = DTYPES[code]
    assert (dtype.block, dtype.block_bytes) == (block, block_bytes)
    assert dtype.nbytes(3 * block) == 3 * block_bytes
    assert dtype.nbytes(block + 1) is None  # a partial block is no tensor


def test_block_types_are_not_safetensors_dtypes() -> None:
    assert len(BLOCK_TYPES) >= 10
    assert not set(BLOCK_TYPES) & set(BITS_BY_DTYPE)


def test_element_nbytes_and_precision() -> None:
    assert DTYPES["BF16"].nbytes(3) == 6
    assert DTYPES["F4"].nbytes(4) == 2 and DTYPES["F4"].nbytes(3) is None
    assert [
        c for c in ("BF16", "F16", "F32", "F8_E4M3", "I8", "F4", "U8") if is_high_precision(c)
    ] == [
        "BF16",
        "F16",
        "F32",
    ]
