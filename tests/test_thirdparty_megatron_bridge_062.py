"""Verdicts on what Megatron-Bridge 0.6.2 (megatron-core 0.19.2) really writes.

``tests/data/megatron_bridge_062/<case>/`` holds, per shipped fixture, the Megatron checkpoint
Megatron-Bridge 0.6.2's ``AutoBridge`` wrote from it (``megatron/``) and the HF checkpoint it
exported back from that (``hf/``), written on CPU by ``tests/thirdparty/megatron_bridge_062/``
(``regenerate.sh``; its NOTES.md lists the shims, none of which changes a weight). ``-mtp1``
cases were converted with ``mtp_num_layers = 1`` passed to the bridge, as a user does when the
bridge does not read the count. The round trips replay the tool's recorded output as the
user's converter commands, so ``roundtrip`` judges exactly what the tool wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

CORPUS = Path(__file__).resolve().parent / "data" / "megatron_bridge_062"
CLEAN = {  # case -> tensors of `diff SOURCE MEGATRON --all`, every one bit-identical
    "deepseek_v3": 60,
    "glm4_moe": 54,
    "glm_moe_dsa-mtp1": 75,
    "qwen3_next-mtp1": 63,
    "qwen3_5_text": 53,
}


def _source(case: str) -> Path:
    return FIXTURES / case.removesuffix("-mtp1")


def _roundtrip(run_cli, case: str, tmp_path: Path) -> dict:
    tool = CORPUS / case
    run = run_cli(
        "roundtrip", _source(case), "--workdir", tmp_path, "--format", "json",
        "--to-megatron", f"cp -r {tool / 'megatron'} {{dst}}  # replays {{src}}",
        "--to-hf", f"cp -r {tool / 'hf'} {{dst}}  # replays {{src}}",
    )  # fmt: skip
    report = json.loads(run.stdout)
    assert run.exit_code == (0 if report["ok"] else 1), run
    return report


def _failing(report: dict) -> dict[str, list[str]]:
    return {
        c["name"]: [f["subject"] for f in c["findings"] if f["status"] == "fail"]
        for c in report["checks"]
        if c["status"] == "fail"
    }


def test_versions_recorded() -> None:
    for case in CLEAN:
        versions = json.loads((CORPUS / case / "convert.json").read_text())["versions"]
        assert (versions["megatron-bridge"], versions["megatron-core"]) == ("0.6.2", "0.19.2")


@pytest.mark.parametrize("case", sorted(CLEAN))
def test_the_megatron_output_maps_bit_for_bit(run_cli, case: str) -> None:
    inspected = run_cli("inspect", CORPUS / case / "megatron", "--format", "json")
    assert inspected.exit_code == 0, inspected
    run = run_cli("diff", _source(case), CORPUS / case / "megatron", "--all", "--format", "json")
    assert run.exit_code == 0, run
    tensors = json.loads(run.stdout)["tensors"]
    assert len(tensors) == CLEAN[case]
    assert {t["status"] for t in tensors} == {"equal"}


@pytest.mark.parametrize("case", ["glm_moe_dsa-mtp1", "qwen3_next-mtp1", "qwen3_5_text"])
def test_round_trip_through_the_tool_passes(run_cli, case: str, tmp_path: Path) -> None:
    report = _roundtrip(run_cli, case, tmp_path)
    assert report["ok"] and _failing(report) == {}


@pytest.mark.parametrize("case", ["deepseek_v3", "glm4_moe"])
def test_the_export_drops_the_stored_embedding_and_head_copies(
    run_cli, case: str, tmp_path: Path
) -> None:
    """Stage 1 holds every MTP tensor; the exported HF checkpoint lacks the MTP layer's
    ``embed_tokens`` / ``shared_head.head`` copies, which stage 2 is blamed for."""
    report = _roundtrip(run_cli, case, tmp_path)
    failing = _failing(report)
    copies = ["model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"]
    assert failing["roundtrip-tensors"] == copies
    assert not any(name.startswith(("source-", "stage1-")) for name in failing)
    messages = {
        f["subject"]: f["message"]
        for c in report["checks"]
        if c["name"] == "roundtrip-tensors"
        for f in c["findings"]
    }
    assert messages[copies[0]] == "stage 2 (Megatron -> HF): missing in final (was BF16[64, 16])"


@pytest.mark.parametrize(("case", "lost"), [("glm_moe_dsa", 30), ("qwen3_next", 22)])
def test_without_the_count_the_bridge_drops_the_mtp_layer(
    run_cli, case: str, lost: int, tmp_path: Path
) -> None:
    """Megatron-Bridge 0.6.2 sets ``mtp_num_layers`` to None for GLM-5 (hard-coded) and for a
    Qwen3-Next config without a count key: stage 1 loses the layer, and says so."""
    report = _roundtrip(run_cli, case, tmp_path)
    failing = _failing(report)
    assert failing["stage1-mtp-count"] == ["mtp_num_layers"]
    assert len(failing["stage1-tensors"]) == lost
    assert "final-mtp-count" in failing
    count = next(c for c in report["checks"] if c["name"] == "stage1-mtp-count")
    assert count["findings"][0]["message"] == (
        "stage 1 (HF -> Megatron): Megatron declares 0 (mtp_num_layers: null), the source 1"
    )


def test_a_vision_language_checkpoint_is_read_without_its_language_model_prefix(run_cli) -> None:
    """Megatron-Bridge writes Qwen3.5-MoE (VLM) as ``language_model.*`` beside
    ``vision_model.*``: the MTP layer is found there, not reported lost; the VLM family has
    no mapping yet, so ``diff`` with the HF source is refused, naming it."""
    megatron = CORPUS / "qwen3_5_moe" / "megatron"
    run = run_cli("inspect", megatron, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (summary,) = report["inputs"]
    assert summary["declared_mtp_layers"] == 1
    assert [layer["complete"] for layer in summary["mtp_layers"]] == [True]
    assert all(not t.startswith("language_model.") for t in summary["mtp_layers"][0]["tensors"])
    refused = run_cli("diff", FIXTURES / "qwen3_5_moe", megatron)
    assert refused.exit_code == 2
    assert "no HF <-> Megatron mapping for Qwen3.5 / 3.6 (VLM) yet" in refused.stderr
