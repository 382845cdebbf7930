"""A changed dtype is a finding; whether the values survived it is said beside it, and decides
it: a widening that keeps every value warns, any other change fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_safetensors

VALUES = np.array([1.0, -0.0, 3.140625, -1e-3, np.inf, 65504.0], dtype=np.float32)


def _bf16(values: np.ndarray) -> bytes:
    """Truncate float32 to bfloat16 bits (exact for VALUES but -1e-3 and 65504, which need
    more than bfloat16's 8 significant bits)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _diff(run_cli, tmp_path: Path, a: tuple[str, bytes], b: tuple[str, bytes]) -> dict:
    for side, (dtype, data) in (("a", a), ("b", b)):
        write_safetensors(tmp_path / f"{side}.safetensors", {"w": (dtype, [len(VALUES)], data)})
    run = run_cli(
        "diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--all", "--format", "json"
    )
    report = json.loads(run.stdout)
    (tensor,) = report["tensors"]
    assert tensor["status"] == "dtype_changed"
    (finding,) = [f for c in report["checks"] for f in c["findings"] if f["subject"] == "w"]
    kept = tensor["values_differing"] == 0
    assert (run.exit_code, finding["status"]) == ((0, "warn") if kept else (1, "fail")), run
    return tensor


def _as_float32(bf16: bytes) -> bytes:
    return (np.frombuffer(bf16, dtype=np.uint16).astype(np.uint32) << 16).tobytes()


def test_bf16_stored_as_f32_keeps_every_value(run_cli, tmp_path: Path) -> None:
    bf16 = _bf16(VALUES)
    tensor = _diff(run_cli, tmp_path, ("BF16", bf16), ("F32", _as_float32(bf16)))
    assert tensor["values_differing"] == 0


def test_a_changed_value_is_counted_and_the_sign_of_zero_is_a_value(
    run_cli, tmp_path: Path
) -> None:
    bf16 = _bf16(VALUES)
    wide = bytearray(_as_float32(bf16))
    wide[4 * 1 + 3] ^= 0x80  # -0.0 -> +0.0
    wide[4 * 2] ^= 0x01  # 3.140625 plus one float32 ulp: no bfloat16 holds it
    tensor = _diff(run_cli, tmp_path, ("BF16", bf16), ("F32", bytes(wide)))
    assert tensor["values_differing"] == 2


def test_f32_narrowed_to_bf16_is_judged_the_other_way(run_cli, tmp_path: Path) -> None:
    """A (F32) cut to B (BF16): -1e-3 and 65504 do not survive; widening B back shows it."""
    tensor = _diff(run_cli, tmp_path, ("F32", VALUES.tobytes()), ("BF16", _bf16(VALUES)))
    assert tensor["values_differing"] == 2


@pytest.mark.parametrize(("narrow", "wide"), [("F16", "F32"), ("F32", "F64"), ("F16", "F64")])
def test_ieee_widenings(run_cli, tmp_path: Path, narrow: str, wide: str) -> None:
    types = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
    values = VALUES.astype(types[narrow])
    tensor = _diff(
        run_cli, tmp_path, (narrow, values.tobytes()), (wide, values.astype(types[wide]).tobytes())
    )
    assert tensor["values_differing"] == 0


def test_types_without_an_exact_widening_compare_values(run_cli, tmp_path: Path) -> None:
    """BF16 and F16 hold different values: each side is decoded and the values compared; -1e-3
    and 65504 (as BF16 cut them) are not the F16 ones."""
    tensor = _diff(
        run_cli, tmp_path, ("BF16", _bf16(VALUES)), ("F16", VALUES.astype(np.float16).tobytes())
    )
    assert tensor["values_differing"] == 2


def test_values_both_types_hold_are_kept_across_them(run_cli, tmp_path: Path) -> None:
    """AutoRound's GPTQ export writes GLM's BF16 attention biases as F16: where every value
    is one both types hold, nothing is lost (a warning, not a failure)."""
    kept = np.array([1.0, -0.0, 3.140625, np.inf, 0.5, -2.0], dtype=np.float32)
    tensor = _diff(
        run_cli, tmp_path, ("BF16", _bf16(kept)), ("F16", kept.astype(np.float16).tobytes())
    )
    assert tensor["values_differing"] == 0
