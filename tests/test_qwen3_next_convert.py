"""Qwen3-Next through the built-in converter: gated delta net layers, MTP, checked against
megatron-core's own ``GatedDeltaNet`` and transformers' own ``Qwen3NextGatedDeltaNet``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtpcheck import CheckName
from mtpcheck.convert.builtin import hf_to_megatron
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES

SOURCE = FIXTURES / "qwen3_next"
CHECK = Path(__file__).with_name("megatron_gdn_check.py")
GDN = "decoder.layers.0.self_attention."


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_to_megatron(open_checkpoint(SOURCE), tmp_path_factory.mktemp("qwen3") / "out")


def test_round_trip_is_bit_exact(run_cli, tmp_path: Path) -> None:
    run = run_cli("roundtrip", SOURCE, "--all", "--workdir", tmp_path, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses.pop(CheckName.SOURCE_SHARED_COPIES) == "skip"  # the family stores no copies
    statuses.pop(CheckName.SOURCE_SERVING)  # tests/test_serving.py
    assert set(statuses.values()) == {"pass"}
    assert len(report["tensors"]) == 83
    assert {t["status"] for t in report["tensors"]} == {"equal"}


def test_gated_delta_net_on_disk_as_megatron_core_splits_it(converted: Path) -> None:
    ckpt = open_checkpoint(converted)
    # the reader joins the split keys back into megatron-core's fused tensors
    assert ckpt.tensors[GDN + "in_proj.weight"].shape == (56, 16)  # 8+8+16+16+4+4 rows
    assert ckpt.tensors[GDN + "conv1d.weight"].shape == (32, 1, 2)
    assert "decoder.layers.0.input_layernorm.weight" in ckpt.tensors
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(CHECK), str(SOURCE), str(converted)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    parts = ("query", "key", "value", "z", "beta", "alpha")
    assert result.pop("on_disk_keys") == sorted(
        [
            *(f"{GDN}in_proj.weight.{p}" for p in parts),
            *(f"{GDN}conv1d.weight.{p}" for p in parts[:3]),
            GDN + "in_proj.layer_norm_weight",
            GDN + "A_log",
            GDN + "dt_bias",
            GDN + "out_norm.weight",
            GDN + "out_proj.weight",
        ]
    )
    # every part megatron-core's forward takes is, bit for bit, the part transformers takes
    assert result == {
        **dict.fromkeys(parts, True),
        **dict.fromkeys(("conv1d", "A_log", "dt_bias", "out_norm", "out_proj"), True),
    }


def test_zero_centred_norm_conversion_is_named_by_diff(run_cli, tmp_path: Path) -> None:
    """Megatron-Bridge stores the gated delta net's ``linear_attn.norm`` zero-centred (minus 1
    on import, plus 1 on export); in bf16 that is exact only for weights in [0.5, 256)."""
    from safetensors.torch import load_file, save_file

    name = "model.layers.0.linear_attn.norm.weight"
    trained = torch.tensor([0.251953125, 0.7, 1.0, 1.3], dtype=torch.bfloat16)  # 129/512
    exported = ((trained - 1) + 1).to(torch.bfloat16)  # each step rounds to bf16
    assert exported.view(torch.int16).tolist()[1:] == trained.view(torch.int16).tolist()[1:]
    assert exported[0].item() != trained[0].item()  # 0.251953125 - 1 has no bf16 value
    for label, value in (("original", trained), ("exported", exported)):
        shutil.copytree(SOURCE, tmp_path / label)
        weights = load_file(str(tmp_path / label / "model.safetensors"))
        weights[name] = value
        save_file(weights, str(tmp_path / label / "model.safetensors"), metadata={"format": "pt"})
    run = run_cli("diff", tmp_path / "original", tmp_path / "exported", "--all", "--format", "json")
    assert run.exit_code == 1, run
    failing = [t for t in json.loads(run.stdout)["tensors"] if t["status"] != "equal"]
    assert [(t["name"], t["status"], t["differing_elements"]) for t in failing] == [
        (name, "bits_differ", 1)
    ]
