"""The quantization check costs in proportion to what it finds: a checkpoint with no scheme and
nothing stored quantized pays for no storage; storages are worked out once per distinct form;
a quantized checkpoint is still judged, and fails where its config does not declare it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mtpcheck.checks import quant_checks
from mtpcheck.checks.quant_checks import quantization_check
from mtpcheck.families import analyse
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Status, TensorMeta
from mtpcheck.params import Method, declared_scheme
from mtpcheck.params.storage import storage_of
from tests.conftest import FIXTURES

QUANTIZED = FIXTURES / "quantized" / "llmc-mfptq-deepseek_v3-fp8_dynamic-quantized"


def _check(path: Path) -> Any:
    ckpt = open_checkpoint(path)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    return quantization_check(analysis, ckpt.tensors, declared_scheme(ckpt))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every parameter whose storage the check works out, by name."""
    seen: list[str] = []
    real: Callable[..., Any] = storage_of

    def counted(param: Any, tensors: Any, scheme: Any) -> Any:
        seen.append(param.name)
        return real(param, tensors, scheme)

    monkeypatch.setattr(quant_checks, "storage_of", counted)
    return seen


def test_no_scheme_and_nothing_quantized_pays_for_no_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _counting(monkeypatch)
    for name in ("deepseek_v3", "mimo", "qwen3_next"):
        ckpt = open_checkpoint(FIXTURES / name)
        assert declared_scheme(ckpt).method is Method.NONE
        assert _check(FIXTURES / name) is None
    assert seen == []


def test_storages_are_worked_out_once_per_distinct_form(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counting(monkeypatch)
    result = _check(QUANTIZED)
    assert result is not None and [f.status for f in result.findings] == [Status.PASS]
    # the MTP layer's routed experts share a form: far fewer storages than matrices judged
    assert 0 < len(seen) < 20


def test_quantized_weights_without_a_scheme_still_fail(tmp_path: Path) -> None:
    """Nothing declares quantization, yet the MTP layer is stored FP8: the check is not
    skipped, and says engines cannot load it."""
    copy = Path(shutil.copytree(QUANTIZED, tmp_path / "undeclared"))
    config = json.loads((copy / "config.json").read_text())
    del config["quantization_config"]
    (copy / "config.json").write_text(json.dumps(config))
    result = _check(copy)
    assert result is not None
    [finding] = result.findings
    assert finding.status is Status.FAIL
    assert "but the config declares no quantization_config" in finding.message


def _meta(name: str, dtype: str) -> TensorMeta:
    return TensorMeta(name, dtype, (4, 4), "f", 0, 32)


@pytest.mark.parametrize(
    ("stored", "may"),
    [
        ({"a.weight": "BF16", "b.weight": "F32"}, False),
        ({"a.weight": "BF16", "a.weight_scale": "BF16"}, False),  # a scale alone: still float
        ({"a.weight": "F8_E4M3"}, True),
        ({"a.qweight": "F32"}, True),  # float-typed, but named as packed values
        ({"a.weight": "F32", "a.weight.quant_map": "F32"}, True),  # a codebook (NF4)
    ],
)
def test_the_skip_is_exact(stored: dict[str, str], may: bool) -> None:
    """Without a scheme, the check is skipped only where no parameter can be stored
    quantized: a float-typed tensor named as packed values or a codebook is not skipped."""
    tensors = {n: _meta(n, d) for n, d in stored.items()}
    assert quant_checks._may_be_quantized(tensors) is may
