"""mlx-lm conversions written by the real tool (``tests/data/mlx``, made by
``tests/thirdparty/mlx/regenerate.sh`` with mlx-lm 0.32.2 on CPU; NOTES.md there): every
conversion drops the MTP layer and the audit names mlx-lm for it; the MTP layer added back
exactly as mlx-lm stores the main layers (experts stacked as ``switch_mlp``, affine 4 / 8-bit,
NVFP4, MXFP4, MXFP8) is diffed against its source expert by expert, dequantized, and a flipped
bit fails at its parameter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import Run, findings_of, flip_bit, tensor_offset
from tests.thirdparty.tools import tool_output

CORPUS = tool_output("mlx")
CASES = sorted(p.name for p in CORPUS.iterdir() if p.name.endswith(("-intact", "-lost")))
INTACT = [c for c in CASES if c.endswith("-intact")]
LOST = [c for c in CASES if c.endswith("-lost")]
LABEL = {"affine4": "INT4", "affine8": "INT8", "nvfp4": "NVFP4", "mxfp4": "MXFP4", "mxfp8": "MXFP8"}
WORST_STEPS = 0.5
"""Worst measured on this corpus: the float modes 0.500; affine 4-bit 0.476 and 8-bit 0.188,
past the BF16 rounding of the scale, bias and result that mlx-lm's quantizer computes in and
measured from the grid's ends where it clipped."""
DROPS = (
    "written by mlx-lm (safetensors metadata format 'mlx'), which drops the MTP layer of every "
    "model it converts (each model's sanitize() removes the layers past num_hidden_layers; "
    "DeepSeek-V3's removes only model.layers.61 and refuses any other) while config.json keeps "
    "the count key: this checkpoint has no drafter; serve the original for MTP speculative "
    "decoding, or set the count key to 0"
)


def _source(case: str) -> Path:
    return CORPUS / f"source-{case.split('-')[0]}"


def _mode(case: str) -> str:
    return case.split("-")[1]


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def test_the_corpus_has_every_mode_lost_and_intact() -> None:
    wide = {_mode(c) for c in INTACT if c.startswith("glm4_moe_wide-")}
    assert wide == set(LABEL)
    assert {c.replace("-intact", "-lost") for c in INTACT} <= set(LOST)
    for refused in ("deepseek_v3", "glm4_moe"):  # the unmodified fixtures, as mlx-lm refused them
        assert (CORPUS / "refusals" / f"{refused}.txt").read_text().strip()


@pytest.mark.parametrize("case", LOST)
def test_every_conversion_loses_the_mtp_layer_and_mlx_lm_is_named(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    report = _report(run)
    assert findings_of(report, "fail", CheckName.MTP_COUNT) == [
        (
            "mtp-count",
            "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint "
            "holds no MTP weights",
        )
    ]
    assert findings_of(report, "info", CheckName.MTP_COUNT) == [("writer", DROPS)]


@pytest.mark.parametrize("case", [c for c in INTACT if _mode(c) in LABEL])
def test_inspect_names_the_mode(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 0, run
    ((_, message),) = findings_of(_report(run), "pass", CheckName.MTP_QUANTIZATION)
    label = "BF16" if case.startswith("glm4_moe-affine4") else LABEL[_mode(case)]
    assert message.startswith(f"stored {label}"), message
    assert f"under mlx {'affine' if 'affine' in case else _mode(case)}" in message, message


@pytest.mark.parametrize("case", INTACT)
def test_diff_compares_stacked_experts_one_by_one_and_dequantizes(case: str, run_cli) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    tensors = {t["name"]: t for t in report["tensors"]}
    assert {t["status"] for t in tensors.values()} <= {"equal", "quantized"}
    experts = [n for n in tensors if n.startswith("model.layers.2.mlp.experts.")]
    assert experts and not [n for n in tensors if ".switch_mlp." in n]
    quantized = [t for t in tensors.values() if t["status"] == "quantized"]
    assert all(t["steps"] is not None and t["steps"] <= WORST_STEPS for t in quantized)
    assert not [m for _, m in findings_of(report, "info") if "dequantized" in m]
    if _mode(case) in ("bf16", "affine4") and case.startswith("glm4_moe-"):
        assert not quantized  # 16 wide: mlx-lm quantizes nothing (group 64) and says affine
    else:
        assert "model.layers.2.mlp.experts.1.gate_proj.weight" in {t["name"] for t in quantized}


def _shard_of(case_dir: Path, name: str) -> Path:
    index = json.loads((case_dir / "model.safetensors.index.json").read_text())
    return case_dir / index["weight_map"][name]


STACKED = "model.layers.2.mlp.switch_mlp.down_proj"
DAMAGE = [
    # (case, stored tensor, byte, bit, the parameter that fails)
    # expert 1's slice of the stacked codes: [2, 64, 8] U32, so its bytes start at 64 * 8 * 4
    (
        "glm4_moe_wide-affine4-intact",
        f"{STACKED}.weight",
        64 * 8 * 4 + 3,
        7,
        "model.layers.2.mlp.experts.1.down_proj.weight",
    ),
    ("glm4_moe_wide-affine8-intact", "model.layers.2.eh_proj.scales", 1, 6, None),
    ("glm4_moe_wide-affine4-intact", "model.layers.2.eh_proj.biases", 1, 6, None),
    ("glm4_moe_wide-nvfp4-intact", "model.layers.2.eh_proj.scales", 0, 6, None),
    ("glm4_moe_wide-mxfp8-intact", "model.layers.2.eh_proj.weight", 2, 6, None),
]


@pytest.mark.parametrize(("case", "tensor", "byte", "bit", "param"), DAMAGE)
def test_a_flipped_bit_fails_at_its_parameter(
    case: str, tensor: str, byte: int, bit: int, param: str | None, run_cli, tmp_path: Path
) -> None:
    damaged = shutil.copytree(CORPUS / case, tmp_path / case)
    shard = _shard_of(damaged, tensor)
    flip_bit(shard, tensor_offset(shard, tensor) + byte, bit)
    run = run_cli("diff", _source(case), damaged, "--dequantize", "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = findings_of(_report(run), "fail")
    assert subject == (param or "model.layers.2.eh_proj.weight")
    assert message.endswith(": the quantized values are not the full-precision ones"), message
