"""GLM-5 (``glm_moe_dsa``: MLA with the DSA indexer, 78 hidden + 1 MTP layer) through the
built-in converter, checked against megatron-core's own ``DSAIndexer``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.convert.builtin import hf_to_megatron
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.safe_pickle import load_raw_pickle
from tests.conftest import FIXTURES

SOURCE = FIXTURES / "glm_moe_dsa"
CHECK = Path(__file__).with_name("megatron_dsa_check.py")
DAMAGING = f"{sys.executable} {Path(__file__).parent / 'converters' / 'damaging.py'}"
STAGE1 = "stage 1 (HF -> Megatron)"
INDEXER = ("linear_wq_b.weight", "linear_wk.weight", "k_norm.weight", "k_norm.bias")
INDEXER += ("linear_weights_proj.weight",)

# GLM-5's published geometry: 78 hidden layers, the first 3 dense, 1 MTP layer, 256 routed
# experts (8 per token), MLA ranks 2048 / 512, 64 heads, the indexer's top-2048. The synthetic
# round trip scales the dimensions down and keeps the structure.
GLM5 = {
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
    "hidden_size": 6144,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "index_topk": 2048,
    "vocab_size": 154880,
    "rope_parameters": {"rope_theta": 8000000, "rope_type": "default"},
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_to_megatron(open_checkpoint(SOURCE), tmp_path_factory.mktemp("glm5") / "out")


def _report(run: Any) -> dict[str, Any]:
    return json.loads(run.stdout)


def test_round_trip_is_bit_exact(run_cli, tmp_path: Path) -> None:
    run = run_cli("roundtrip", SOURCE, "--all", "--workdir", tmp_path, "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses.pop(CheckName.SOURCE_SHARED_COPIES) == "skip"  # the family stores no copies
    statuses.pop(CheckName.SOURCE_SERVING)  # tests/test_serving.py
    assert set(statuses.values()) == {"pass"}
    assert len(report["tensors"]) == 86
    assert {t["status"] for t in report["tensors"]} == {"equal"}


def test_layout_is_megatron_core_experimental_dsa_spec(converted: Path) -> None:
    """Per-layer keys (``moe_layer_freq`` is a list), the input norm not fused (DSA's MLA),
    standalone q/kv norms, the dense layer's MLP norm fused into ``linear_fc1``, the MoE
    layer's kept as ``pre_mlp_layernorm``, the indexer under ``core_attention.indexer``."""
    keys = set(load_raw_pickle(converted / ".metadata").state_dict_metadata)
    for layer in ("decoder.layers.0.", "decoder.layers.1.", "mtp.layers.0.transformer_layer."):
        attention = layer + "self_attention."
        assert {
            layer + "input_layernorm.weight",
            attention + "q_layernorm.weight",
            attention + "kv_layernorm.weight",
            *(attention + "core_attention.indexer." + n for n in INDEXER),
        } <= keys
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in keys
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys
    assert "mtp.layers.0.transformer_layer.pre_mlp_layernorm.weight" in keys
    assert not any("linear_qkv" in k or k.startswith("decoder.layers.self_attention") for k in keys)


def test_indexer_loads_into_megatron_core_dsa_indexer(converted: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(CHECK), str(SOURCE), str(converted)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        f"{layer}self_attention.core_attention.indexer.{n}": True
        for layer in ("decoder.layers.0.", "mtp.layers.0.transformer_layer.")
        for n in INDEXER
    }
    assert result == expected


def test_synthetic_glm5_78_plus_1_round_trip(run_cli, tmp_path: Path) -> None:
    config = {**json.loads((SOURCE / "config.json").read_text()), **GLM5}
    for key in ("indexer_types", "layer_types", "mlp_layer_types"):
        config.pop(key)  # per-layer lists of the 2-layer fixture
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = run_cli("roundtrip", path, "--synthetic", "--workdir", tmp_path / "w", "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert (
        statuses.pop(CheckName.SOURCE_SERVING) == "warn"
    )  # the fixture's config has no router keys
    assert set(statuses.values()) == {"pass"}  # copies built and compared
    source = report["inputs"][0]
    assert (source["family"], source["declared_mtp_layers"]) == ("glm_moe_dsa", 1)
    (layer,) = source["mtp_layers"]
    assert layer["complete"] and any(".indexer." in n for n in layer["tensors"])


def test_converter_with_mtp_off_fails_at_stage_1(run_cli, tmp_path: Path) -> None:
    """Megatron-Bridge's GLM-5 bridge leaves MTP out by default (``mtp_num_layers`` None)."""
    run = run_cli(
        "roundtrip",
        SOURCE,
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-megatron",
        f"{DAMAGING} mtp-off {{src}} {{dst}}",
    )
    assert run.exit_code == 1, run
    report = _report(run)
    failed = {c["name"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {
        CheckName.STAGE1_MTP_COUNT,
        CheckName.STAGE1_TENSORS,
        CheckName.ROUNDTRIP_TENSORS,
        CheckName.FINAL_MTP_COUNT,
    }
    (count,) = [c for c in report["checks"] if c["name"] == CheckName.STAGE1_MTP_COUNT]
    assert count["findings"][0]["message"] == (
        f"{STAGE1}: Megatron declares 0 (mtp_num_layers: null), the source 1"
    )
    (final,) = [c for c in report["checks"] if c["name"] == CheckName.ROUNDTRIP_TENSORS]
    lost = {f["subject"]: f["message"] for f in final["findings"] if f["status"] == "fail"}
    mtp = {n for n in open_checkpoint(SOURCE).tensors if n.startswith("model.layers.2.")}
    assert set(lost) == mtp and len(mtp) == 35
    assert all(m.startswith(STAGE1) for m in lost.values())
