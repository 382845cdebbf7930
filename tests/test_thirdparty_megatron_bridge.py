"""Checkpoints written by Megatron-Bridge 0.3.1 (``AutoBridge``), not by mtpcheck.

Megatron-Bridge runs on CPU through ``tests/thirdparty/megatron_bridge_convert.py`` (its CUDA and
Transformer Engine calls shimmed there, never in mtpcheck) as the round trip's converter in both
directions. What it does to the shipped fixtures, and what each test pins:

* DeepSeek-V3: its 0.3.1 bridge leaves MTP out (``mtp_num_layers: null`` in ``run_config.yaml``),
  so the whole MTP layer is lost in stage 1 while the exported config still declares it;
* GLM-4.5: MTP converted, but the router's fp32 ``e_score_correction_bias`` passes through bf16
  (rounded in stage 1), and the export writes no ``embed_tokens`` / ``shared_head.head`` copies.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mtpcheck import CheckName
from mtpcheck.cli import cli
from tests.conftest import FIXTURES
from tests.thirdparty.runs import Kept, Roundtrips
from tests.thirdparty.runs import failing as _failing
from tests.thirdparty.runs import statuses as _statuses

pytestmark = pytest.mark.slow  # runs a third-party converter

STAGE1 = "stage 1 (HF -> Megatron)"
STAGE2 = "stage 2 (Megatron -> HF)"


def _mtpcheck(*args: str | Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli, [*map(str, args), "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def deepseek(thirdparty_runs: Roundtrips) -> Kept:
    return thirdparty_runs.get("bridge-deepseek_v3")


@pytest.fixture(scope="module")
def glm(thirdparty_runs: Roundtrips) -> Kept:
    return thirdparty_runs.get("bridge-glm4_moe")


def _mtp_tensors(family: str) -> set[str]:
    index = FIXTURES / family / "model.safetensors.index.json"
    if index.is_file():
        names = json.loads(index.read_text())["weight_map"]
    else:
        from safetensors import safe_open

        with safe_open(FIXTURES / family / "model.safetensors", "pt") as f:
            names = list(f.keys())
    return {n for n in names if n.startswith("model.layers.2.")}


@pytest.mark.parametrize("family", ["deepseek", "glm"])
def test_bridge_metadata_holds_a_save_plan_and_is_read(
    request: pytest.FixtureRequest, family: str
) -> None:
    """Megatron-Bridge's ``.metadata`` pickles torch DCP's SavePlan: once refused as unsafe."""
    bridge_run: Kept = request.getfixturevalue(family)
    metadata = bridge_run.megatron / "iter_0000000" / ".metadata"
    strings = {
        arg for _, arg, _ in pickletools.genops(metadata.read_bytes()) if isinstance(arg, str)
    }
    assert {"torch.distributed.checkpoint.planner", "SavePlan", "WriteItem"} <= strings
    code, report = _mtpcheck("inspect", bridge_run.megatron)
    assert code == 0, report
    assert report["inputs"][0]["format"] == "megatron-torch-dist"


def test_deepseek_v3_mtp_dropped_in_stage_1(deepseek: Kept) -> None:
    assert deepseek.exit_code == 1
    report = deepseek.report
    assert _statuses(report) == {
        CheckName.SOURCE_INTEGRITY: "pass",
        CheckName.SOURCE_FAMILY: "pass",
        CheckName.SOURCE_MTP_COUNT: "pass",
        CheckName.SOURCE_MTP_LAYERS: "pass",
        CheckName.SOURCE_MTP_SHAPES: "pass",
        CheckName.SOURCE_SHARED_COPIES: "pass",
        CheckName.SOURCE_MTP_TRAINED: "pass",
        CheckName.SOURCE_SERVING: "warn",  # the fixture's config lacks scoring_func / topk_method
        CheckName.SOURCE_MAIN_MODEL: "pass",
        CheckName.SOURCE_MCORE_MODEL: "pass",
        CheckName.STAGE1_CONVERT: "pass",
        CheckName.STAGE1_MTP_COUNT: "fail",
        CheckName.STAGE1_TENSORS: "fail",
        CheckName.STAGE2_CONVERT: "pass",
        CheckName.CONFIG: "pass",
        CheckName.ROUNDTRIP_TENSORS: "fail",
        CheckName.FINAL_MAIN_MODEL: "pass",
        CheckName.FINAL_MTP_COUNT: "fail",
    }
    assert _failing(report, CheckName.STAGE1_MTP_COUNT) == {
        "mtp_num_layers": f"{STAGE1}: Megatron declares 0 (mtp_num_layers: null), the source 1"
    }
    stage1 = _failing(report, CheckName.STAGE1_TENSORS)
    assert len(stage1) == 25 and all(n.startswith("mtp.layers.0.") for n in stage1)
    assert all(m.startswith(f"{STAGE1}: missing in Megatron output") for m in stage1.values())
    final = _failing(report, CheckName.ROUNDTRIP_TENSORS)
    assert set(final) == _mtp_tensors("deepseek_v3") and len(final) == 32
    assert all(m.startswith(STAGE1) and "missing in final" in m for m in final.values()), final
    assert _failing(report, CheckName.FINAL_MTP_COUNT) == {
        "mtp-count": "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the "
        "checkpoint holds no MTP weights"
    }


def test_deepseek_v3_megatron_output_declares_and_holds_no_mtp(deepseek: Kept) -> None:
    code, report = _mtpcheck("inspect", deepseek.megatron)
    assert code == 0
    (count,) = [c for c in report["checks"] if c["name"] == CheckName.MTP_COUNT]
    assert count["findings"][0]["message"] == (
        "config declares 0 MTP layers (mtp_num_layers: null); none present"
    )
    code, report = _mtpcheck("diff", FIXTURES / "deepseek_v3", deepseek.megatron)
    assert code == 1
    assert _failing(report, CheckName.CONFIG) == {"mtp_num_layers": "1 -> None"}
    missing = _failing(report, CheckName.TENSORS)
    assert len(missing) == 25 and all(m.startswith("missing in B") for m in missing.values())


def test_glm45_router_bias_rounded_and_copies_not_exported(glm: Kept) -> None:
    assert glm.exit_code == 1
    report = glm.report
    assert _statuses(report) == {
        CheckName.SOURCE_INTEGRITY: "pass",
        CheckName.SOURCE_FAMILY: "pass",
        CheckName.SOURCE_MTP_COUNT: "pass",
        CheckName.SOURCE_MTP_LAYERS: "pass",
        CheckName.SOURCE_MTP_SHAPES: "pass",
        CheckName.SOURCE_SHARED_COPIES: "pass",
        CheckName.SOURCE_MTP_TRAINED: "pass",
        CheckName.SOURCE_SERVING: "info",  # vLLM drafts through the main embedding and head
        CheckName.SOURCE_MAIN_MODEL: "pass",
        CheckName.SOURCE_MCORE_MODEL: "pass",
        CheckName.STAGE1_CONVERT: "pass",
        CheckName.STAGE1_MTP_COUNT: "pass",
        CheckName.STAGE1_TENSORS: "fail",
        CheckName.STAGE2_CONVERT: "pass",
        CheckName.CONFIG: "pass",
        CheckName.ROUNDTRIP_TENSORS: "fail",
        CheckName.FINAL_MAIN_MODEL: "pass",
        CheckName.FINAL_MTP_COUNT: "pass",  # GLM-4.6 and later store no copies: optional
    }
    bias = "mtp.layers.0.transformer_layer.mlp.router.expert_bias"
    assert _failing(report, CheckName.STAGE1_TENSORS) == {
        bias: f"{STAGE1}: bits differ in 4 of 4 elements, first at index [0]; max abs diff "
        "1.34646e-05 [from model.layers.2.mlp.gate.e_score_correction_bias]"
    }
    assert _failing(report, CheckName.ROUNDTRIP_TENSORS) == {
        "model.layers.2.embed_tokens.weight": f"{STAGE2}: missing in final (was BF16[64, 16])",
        "model.layers.2.shared_head.head.weight": f"{STAGE2}: missing in final (was BF16[64, 16])",
        "model.layers.2.mlp.gate.e_score_correction_bias": f"{STAGE1} (as {bias}): bits differ "
        "in 4 of 4 elements, first at index [0]; max abs diff 1.34646e-05",
    }


def test_glm45_megatron_output_inspects_clean_and_diff_names_the_bias(glm: Kept) -> None:
    code, report = _mtpcheck("inspect", glm.megatron)
    assert code == 0, report
    (layer,) = report["inputs"][0]["mtp_layers"]
    assert layer["complete"] and layer["prefix"] == "mtp.layers.0.transformer_layer."
    code, report = _mtpcheck("diff", FIXTURES / "glm4_moe", glm.megatron)
    assert code == 1
    assert set(_failing(report, CheckName.TENSORS)) == {
        "mtp.layers.0.transformer_layer.mlp.router.expert_bias"
    }
    code, report = _mtpcheck("diff", FIXTURES / "glm4_moe", glm.hf, "--all")
    assert code == 1
    # layer 1's bias passes through bf16 too, but the fixture's is all zeros, which survive
    assert set(_failing(report, CheckName.TENSORS)) == {
        "model.layers.2.mlp.gate.e_score_correction_bias",
        "model.layers.2.embed_tokens.weight",
        "model.layers.2.shared_head.head.weight",
    }


@pytest.mark.parametrize(
    ("family", "lost"),
    [
        ("deepseek", _mtp_tensors("deepseek_v3")),  # the MTP layer the bridge left out
        ("glm", {"model.layers.2.mlp.gate.e_score_correction_bias"}),  # the bias it rounded
    ],
)
def test_builtin_export_of_the_bridge_checkpoint(
    request: pytest.FixtureRequest, tmp_path: Path, family: str, lost: set[str]
) -> None:
    """mtpcheck's own Megatron -> HF converter reads what Megatron-Bridge wrote (its stacked
    and per-layer keys, local-spec norms, MLA) and gives back every other tensor bit for bit."""
    bridge_run: Kept = request.getfixturevalue(family)
    source = FIXTURES / ("deepseek_v3" if family == "deepseek" else "glm4_moe")
    out = tmp_path / "hf"

    def export(hf_config: Path) -> Any:
        args = [str(bridge_run.megatron), str(out), "--hf-config", str(hf_config), "--copies"]
        return CliRunner().invoke(cli, ["convert", "megatron-to-hf", *args])

    result = export(source / "config.json")
    if family == "deepseek":
        # the bridge left the MTP layer out: an HF checkpoint declaring it would be a lie, so
        # the export is refused and writes nothing; declared as 0 it goes through
        assert result.exit_code == 1, result.stderr
        assert result.stderr.startswith(
            f"mtpcheck: refused: {bridge_run.megatron}: not converted: the HF checkpoint it "
            "would write does not back the config it would carry: mtp-count: config declares "
            "1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint holds no MTP weights"
        )
        assert not out.exists() and list(tmp_path.iterdir()) == []
        config = {**json.loads((source / "config.json").read_text()), "num_nextn_predict_layers": 0}
        (tmp_path / "config.json").write_text(json.dumps(config))
        result = export(tmp_path / "config.json")
    assert result.exit_code == 0, result.stderr
    code, report = _mtpcheck("diff", source, out, "--all")
    assert code == 1
    assert set(_failing(report, CheckName.TENSORS)) == lost
    assert len(report["tensors"]) == (73 if family == "deepseek" else 79)
