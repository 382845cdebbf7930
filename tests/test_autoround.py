"""GPTQ, AWQ and AutoRound checkpoints written by the real tools (``tests/data/autoround``,
made by ``tests/thirdparty/autoround/regenerate.sh`` with auto-round 0.16.1 and gptqmodel
7.7.0 on CPU; NOTES.md there): AutoRound's own format (``auto_round:auto_gptq`` and
``auto_round`` packing), its GPTQ and AWQ exports, its model-free route, and GPTQModel's real
GPTQ. Each gets the verdict its MTP layer deserves, every quantized tensor is dequantized
(zero points and ``g_idx`` included), and damage fails at its parameter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run, findings_of, flip_bit, tensor_offset
from tests.thirdparty.tools import tool_output

CORPUS = tool_output("autoround")
CASES = sorted(p.name for p in CORPUS.iterdir() if p.name.startswith(("autoround-", "gptqmodel-")))
GPTQMODEL = [c for c in CASES if c.startswith("gptqmodel-")]
AUTOROUND = [c for c in CASES if c.startswith("autoround-")]
LOST = [c for c in CASES if c.endswith("-lost")]
QUANTIZED = [c for c in AUTOROUND if "-quantized" in c and not c.endswith("-at-4b")]
BF16_UNDECLARED = [c for c in AUTOROUND if c.endswith("-bf16")]
"""The MTP layer kept in BF16 while the config quantizes its modules: copied back unquantized
(the GPTQ and AWQ exports, the asymmetric auto_round one), or ignored by the model-free route
without an entry in the config."""
AT_4B = "autoround-transformers-deepseek_v3_w32-auto_round-2b-quantized-at-4b"
"""AutoRound 0.16 packs the copied-back MTP layer at 4 bits under a 2-bit config."""
MTP_LOST = (
    "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint holds no MTP "
    "weights"
)


def _source(case: str) -> Path:
    fixture = case.split("-")[2]
    return CORPUS / "sources" / fixture if fixture.endswith("_w32") else FIXTURES / fixture


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def test_the_corpus_covers_each_format_and_fate() -> None:
    formats = {c.split("-")[3] for c in CASES}
    assert formats >= {"auto_round", "auto_round_asym", "auto_gptq", "auto_awq", "gptq_descact"}
    assert {c.split("-")[4] for c in CASES} >= {"2b", "3b", "4b", "8b"}
    assert len(QUANTIZED) >= 8 and len(LOST) == 5 and len(BF16_UNDECLARED) == 8


@pytest.mark.parametrize("case", QUANTIZED)
def test_an_mtp_layer_packed_like_the_main_layers_passes(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 0, run


@pytest.mark.parametrize("case", LOST)
def test_a_lost_mtp_layer_fails_the_count(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    assert ("mtp-count", MTP_LOST) in findings_of(_report(run), "fail", CheckName.MTP_COUNT)


@pytest.mark.parametrize("case", BF16_UNDECLARED)
def test_a_bf16_mtp_layer_the_config_quantizes_fails(case: str, run_cli) -> None:
    """AutoRound's GPTQ and AWQ exports copy the MTP layer back unquantized, and its model-free
    route leaves an ignored layer out of the config: engines build those modules quantized."""
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = findings_of(_report(run), "fail", CheckName.MTP_QUANTIZATION)
    assert subject == "mtp layer 0"
    assert "stored BF16, but quantization_config (" in message, message
    assert message.endswith("so engines build them quantized and cannot load these weights")


def test_an_mtp_layer_packed_at_other_bits_than_declared_fails(run_cli) -> None:
    run = run_cli("inspect", CORPUS / AT_4B, "--format", "json")
    assert run.exit_code == 1, run
    shapes = dict(findings_of(_report(run), "fail", CheckName.MTP_SHAPES))
    assert shapes["model.layers.2.self_attn.o_proj.qweight"] == (
        "shape [4, 32], expected [2, 32] (as model.layers.1.self_attn.o_proj.qweight, the "
        "main-layer tensor it mirrors)"
    )
    diffed = run_cli("diff", _source(AT_4B), CORPUS / AT_4B, "--dequantize", "--format", "json")
    assert diffed.exit_code == 1, diffed
    failed = dict(findings_of(_report(diffed), "fail", CheckName.TENSORS))
    assert failed["model.layers.2.eh_proj.weight"].endswith(
        "cannot be decoded: model.layers.2.eh_proj.qweight: [8, 32] packs 64 columns 4 bits "
        "each, the config declares 2"
    )


@pytest.mark.parametrize("case", [c for c in AUTOROUND if c not in LOST and c != AT_4B])
def test_autoround_rounds_to_nearest_within_half_a_step(case: str, run_cli) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    quantized = [t for t in report["tensors"] if t["status"] == "quantized"]
    assert quantized and all(t["steps"] is not None and t["steps"] <= 0.5 for t in quantized)
    assert not [m for _, m in findings_of(report, "info") if "dequantized:" in m or "judged" in m]
    # AutoRound's transformers route writes F32 (and GLM's biases F16) where the source is BF16
    widened = [t for t in report["tensors"] if t["status"] == "dtype_changed"]
    assert all(t["values_differing"] == 0 for t in widened)


@pytest.mark.parametrize("case", GPTQMODEL)
def test_gptq_error_feedback_is_measured_not_judged(case: str, run_cli) -> None:
    """GPTQModel moves each value to make up for the rounding of the columns before it: up to
    7 steps here. The values are reported; the only failures are the MTP layer it dropped."""
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 1, run
    report = _report(run)
    quantized = [t for t in report["tensors"] if t["status"] == "quantized"]
    unjudged = [m for _, m in findings_of(report, "info", CheckName.TENSORS) if "not judged" in m]
    assert len(unjudged) == len(quantized) == 28
    assert all(
        m.endswith(
            "not judged by steps: GPTQ moves each value to make up for the rounding of the "
            "columns before it"
        )
        for m in unjudged
    )
    assert max(t["steps"] for t in quantized) > 1  # what judging would have failed
    failed = findings_of(report, "fail", CheckName.TENSORS)
    assert len(failed) == 32 and all(m.startswith("missing in B") for _, m in failed)


def _tensor_offset(case_dir: Path, name: str) -> tuple[Path, int]:
    index = case_dir / "model.safetensors.index.json"
    shard = case_dir / (
        json.loads(index.read_text())["weight_map"][name] if index.exists() else "model.safetensors"
    )
    return shard, tensor_offset(shard, name)


ASYM = "autoround-modelfree-deepseek_v3-auto_round_asym-4b-quantized"
AWQ = "autoround-transformers-deepseek_v3_w32-auto_awq_asym-4b-bf16"
GPTQ = "autoround-transformers-deepseek_v3_w32-auto_gptq-4b-bf16"
DAMAGE = [
    # (case, stored tensor, byte, bit, the parameter that fails, or the undecodable message)
    (ASYM, "model.layers.2.eh_proj.qweight", 0, 3, "model.layers.2.eh_proj.weight"),
    (ASYM, "model.layers.2.eh_proj.qzeros", 0, 3, "model.layers.2.eh_proj.weight"),
    (ASYM, "model.layers.2.eh_proj.scales", 1, 6, "model.layers.2.eh_proj.weight"),
    (
        AWQ,
        "model.layers.1.self_attn.o_proj.qweight",
        0,
        3,
        "model.layers.1.self_attn.o_proj.weight",
    ),
    (AWQ, "model.layers.1.self_attn.o_proj.qzeros", 0, 3, "model.layers.1.self_attn.o_proj.weight"),
    (GPTQ, "model.layers.1.self_attn.o_proj.g_idx", 0, 4, "not a group index of 32 columns"),
]


@pytest.mark.parametrize(("case", "tensor", "byte", "bit", "expected"), DAMAGE)
def test_a_flipped_bit_fails_at_its_parameter(
    case: str, tensor: str, byte: int, bit: int, expected: str, run_cli, tmp_path: Path
) -> None:
    damaged = shutil.copytree(CORPUS / case, tmp_path / case)
    shard, offset = _tensor_offset(damaged, tensor)
    flip_bit(shard, offset + byte, bit)
    args = ("--all",) if ".layers.1." in tensor else ()
    run = run_cli("diff", _source(case), damaged, "--dequantize", *args, "--format", "json")
    assert run.exit_code == 1, run
    failed = [(s, m) for s, m in findings_of(_report(run), "fail", CheckName.TENSORS)]
    param = tensor.rpartition(".")[0] + ".weight"
    ((subject, message),) = [(s, m) for s, m in failed if "dtype changed" not in m]
    assert subject == param
    if expected.startswith("model."):
        assert message.endswith(": the quantized values are not the full-precision ones")
    else:
        assert f"cannot be decoded: {tensor}: {expected}" in message, message


def test_a_symmetric_gptq_weight_without_zero_points_is_read_at_the_middle(
    run_cli, tmp_path: Path
) -> None:
    """Some symmetric GPTQ exports store no ``qzeros``: the zero point is then the middle of
    the range (8 at 4 bits), not 8 plus GPTQ v1's stored-minus-one. The AutoRound GPTQ export
    with one module's ``qzeros`` (all 8, stored 7) left out decodes as before."""
    from safetensors.torch import load_file, save_file

    case = GPTQ
    rewritten = shutil.copytree(CORPUS / case, tmp_path / case)
    module = "model.layers.1.self_attn.o_proj"
    shard, _ = _tensor_offset(rewritten, f"{module}.qzeros")
    tensors = load_file(shard)
    assert {int(w) & 0xFFFFFFFF for w in tensors.pop(f"{module}.qzeros").flatten()} == {0x77777777}
    save_file(tensors, shard, metadata={"format": "pt"})
    index = rewritten / "model.safetensors.index.json"
    if index.exists():
        content = json.loads(index.read_text())
        content["weight_map"].pop(f"{module}.qzeros")
        index.write_text(json.dumps(content))
    run = run_cli("diff", _source(case), rewritten, "--all", "--dequantize", "--format", "json")
    report = _report(run)
    (row,) = [t for t in report["tensors"] if t["name"] == f"{module}.weight"]
    assert row["status"] == "quantized" and row["steps"] <= 0.5, row
