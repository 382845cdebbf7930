"""bitsandbytes checkpoints written by the real tool (``tests/data/bitsandbytes``, made by
``tests/thirdparty/bitsandbytes/regenerate.sh``: transformers' ``from_pretrained`` with a
``BitsAndBytesConfig`` and ``save_pretrained``, which loses the MTP layer; and the same output
with the MTP layer quantized by bitsandbytes' own API as transformers quantized the main
layers, NOTES.md there). NF4, NF4 with double quantization, FP4 and LLM.int8, from the
DeepSeek-V3 and GLM-4.5 fixtures: named right, diffed against their source as stored
quantized, dequantized within half a step of it, and a flipped bit fails at its parameter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run, findings_of, flip_bit, tensor_offset
from tests.thirdparty.tools import tool_output

CORPUS = tool_output("bitsandbytes")
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
INTACT = [c for c in CASES if c.endswith("-intact")]
LOST = [c for c in CASES if c.endswith("-lost")]
LABEL = {"nf4": "NF4", "nf4_dq": "NF4", "fp4": "FP4", "int8": "INT8"}
"""What ``inspect`` calls each scheme's storage."""
WORST_STEPS = 0.51
"""Every value within half a step of its source, but for double quantization, whose 8-bit
absmax move the grid a little (worst measured on this corpus: 0.5072 steps)."""
PROJECTION = "model.layers.2.eh_proj"
"""The MTP layer's projection: quantized in every scheme, with no main-layer twin."""


def _source(case: str) -> Path:
    return FIXTURES / case.split("-")[0]


def _scheme(case: str) -> str:
    return case.split("-")[1]


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def test_the_corpus_has_each_scheme_intact_and_lost() -> None:
    fixtures_schemes = {(c.split("-")[0], _scheme(c)) for c in CASES}
    assert fixtures_schemes == {(f, s) for f in ("deepseek_v3", "glm4_moe") for s in LABEL}
    assert len(INTACT) == len(LOST) == 8
    versions = dict(line.split() for line in (CORPUS / "versions.txt").read_text().splitlines())
    assert versions["bitsandbytes"].startswith("0.50.")


@pytest.mark.parametrize("case", INTACT)
def test_inspect_names_the_storage_and_passes(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    (quantization,) = [c for c in report["checks"] if c["name"] == CheckName.MTP_QUANTIZATION]
    (finding,) = quantization["findings"]
    label = LABEL[_scheme(case)]
    assert finding["status"] == "pass"
    assert finding["message"].startswith(f"stored {label} ("), finding
    assert f"where the main layers are {label} (" in finding["message"], finding


@pytest.mark.parametrize("case", LOST)
def test_save_pretrained_loses_the_mtp_layer(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    first = findings_of(_report(run), "fail")[0]
    assert first == (
        "mtp-count",
        "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint holds "
        "no MTP weights",
    )


@pytest.mark.parametrize("case", INTACT)
def test_diff_dequantizes_every_quantized_tensor_within_half_a_step(case: str, run_cli) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    tensors = {t["name"]: t for t in report["tensors"]}
    quantized = {n: t for n, t in tensors.items() if t["status"] == "quantized"}
    assert f"{PROJECTION}.weight" in quantized
    assert all(t["steps"] is not None and t["steps"] <= WORST_STEPS for t in quantized.values())
    assert not [m for _, m in findings_of(report, "info") if "not dequantized" in m]
    # transformers wrote the router in float32: every value kept, warned, not failed
    widened = {n for n, t in tensors.items() if t["status"] == "dtype_changed"}
    assert widened and all(tensors[n]["values_differing"] == 0 for n in widened)
    assert widened == {n for n, _ in findings_of(report, "warn") if n in tensors}
    statuses = {t["status"] for t in tensors.values()}
    assert statuses == {"equal", "quantized", "dtype_changed"}


@pytest.mark.parametrize("case", ["deepseek_v3-nf4-intact", "glm4_moe-int8-intact"])
def test_diff_without_dequantize_reports_the_layout(case: str, run_cli) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--format", "json")
    assert run.exit_code == 0, run
    (projection,) = [t for t in _report(run)["tensors"] if t["name"] == f"{PROJECTION}.weight"]
    assert projection["status"] == "quantized"
    assert projection["storage"][0] == "BF16"
    assert projection["storage"][1].startswith(LABEL[_scheme(case)] + ": ")


DAMAGE = [
    # (case, stored tensor, byte within it, bit): a code's top bit, a scale's exponent bit.
    # Not a double-quantized absmax code: those move a block's absmax around the offset all
    # blocks share, by under one step here (0.65 to 0.99 steps measured for the top bits)
    ("deepseek_v3-nf4-intact", f"{PROJECTION}.weight", 5, 7),
    ("deepseek_v3-nf4-intact", f"{PROJECTION}.weight.absmax", 3 * 4 + 3, 6),
    ("glm4_moe-fp4-intact", f"{PROJECTION}.weight", 9, 7),
    ("deepseek_v3-nf4_dq-intact", f"{PROJECTION}.weight", 11, 7),
    ("deepseek_v3-nf4_dq-intact", f"{PROJECTION}.weight.nested_absmax", 3, 6),
    ("glm4_moe-int8-intact", f"{PROJECTION}.weight", 7, 6),
    ("glm4_moe-int8-intact", f"{PROJECTION}.SCB", 2 * 4 + 3, 6),
]


@pytest.mark.parametrize(("case", "tensor", "byte", "bit"), DAMAGE)
def test_a_flipped_bit_fails_at_its_parameter(
    case: str, tensor: str, byte: int, bit: int, run_cli, tmp_path: Path
) -> None:
    damaged = shutil.copytree(CORPUS / case, tmp_path / case)
    shard = damaged / "model.safetensors"
    flip_bit(shard, tensor_offset(shard, tensor) + byte, bit)
    run = run_cli("diff", _source(case), damaged, "--dequantize", "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = findings_of(_report(run), "fail")
    assert subject == f"{PROJECTION}.weight"
    assert message.endswith(": the quantized values are not the full-precision ones"), message


def test_an_unreadable_quant_state_fails_as_undecodable(run_cli, tmp_path: Path) -> None:
    case = "deepseek_v3-nf4-intact"
    damaged = shutil.copytree(CORPUS / case, tmp_path / case)
    shard = damaged / "model.safetensors"
    state = f"{PROJECTION}.weight.quant_state.bitsandbytes__nf4"
    flip_bit(shard, tensor_offset(shard, state), 7)  # '{' becomes a byte no JSON starts with
    run = run_cli("diff", _source(case), damaged, "--dequantize", "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = findings_of(_report(run), "fail")
    assert subject == f"{PROJECTION}.weight"
    assert f"cannot be decoded: {state}: not bitsandbytes' quant state JSON" in message
