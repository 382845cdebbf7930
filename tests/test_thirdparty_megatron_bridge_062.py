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
import shutil
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, flip_bit
from tests.thirdparty.replay import fail_messages, failing_checks, replay_roundtrip, source_of

CORPUS = Path(__file__).resolve().parent / "data" / "megatron_bridge_062"
CLEAN = {  # case -> tensors of `diff SOURCE MEGATRON --all`, every one bit-identical
    "deepseek_v3": 60,
    "exaone_moe": 77,
    "glm4_moe": 54,
    "glm_moe_dsa-mtp1": 75,
    "nemotron_h": 51,
    "qwen3_next-mtp1": 63,
    "qwen3_5_text": 53,
}


def test_versions_recorded() -> None:
    for case in CLEAN:
        versions = json.loads((CORPUS / case / "convert.json").read_text())["versions"]
        assert (versions["megatron-bridge"], versions["megatron-core"]) == ("0.6.2", "0.19.2")


@pytest.mark.parametrize("case", sorted(CLEAN))
def test_the_megatron_output_maps_bit_for_bit(run_cli, case: str) -> None:
    inspected = run_cli("inspect", CORPUS / case / "megatron", "--format", "json")
    assert inspected.exit_code == 0, inspected
    run = run_cli("diff", source_of(case), CORPUS / case / "megatron", "--all", "--format", "json")
    assert run.exit_code == 0, run
    tensors = json.loads(run.stdout)["tensors"]
    assert len(tensors) == CLEAN[case]
    assert {t["status"] for t in tensors} == {"equal"}


@pytest.mark.parametrize(
    "case", ["glm_moe_dsa-mtp1", "nemotron_h", "qwen3_next-mtp1", "qwen3_5_text"]
)
def test_round_trip_through_the_tool_passes(run_cli, case: str, tmp_path: Path) -> None:
    report = replay_roundtrip(run_cli, CORPUS, case, tmp_path)
    assert report["ok"] and failing_checks(report) == {}


@pytest.mark.parametrize("case", ["deepseek_v3", "glm4_moe"])
def test_the_export_drops_the_stored_embedding_and_head_copies(
    run_cli, case: str, tmp_path: Path
) -> None:
    """Stage 1 holds every MTP tensor; the exported HF checkpoint lacks the MTP layer's
    ``embed_tokens`` / ``shared_head.head`` copies, which stage 2 is blamed for."""
    report = replay_roundtrip(run_cli, CORPUS, case, tmp_path)
    failing = failing_checks(report)
    copies = ["model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"]
    assert failing[CheckName.ROUNDTRIP_TENSORS] == copies
    assert not any(name.startswith(("source-", "stage1-")) for name in failing)
    messages = {
        f["subject"]: f["message"]
        for c in report["checks"]
        if c["name"] == CheckName.ROUNDTRIP_TENSORS
        for f in c["findings"]
    }
    assert messages[copies[0]] == "stage 2 (Megatron -> HF): missing in final (was BF16[64, 16])"


@pytest.mark.parametrize(("case", "lost"), [("glm_moe_dsa", 30), ("qwen3_next", 22)])
def test_without_the_count_the_bridge_drops_the_mtp_layer(
    run_cli, case: str, lost: int, tmp_path: Path
) -> None:
    """Megatron-Bridge 0.6.2 sets ``mtp_num_layers`` to None for GLM-5 (hard-coded) and for a
    Qwen3-Next config without a count key: stage 1 loses the layer, and says so."""
    report = replay_roundtrip(run_cli, CORPUS, case, tmp_path)
    failing = failing_checks(report)
    assert failing[CheckName.STAGE1_MTP_COUNT] == ["mtp_num_layers"]
    assert len(failing[CheckName.STAGE1_TENSORS]) == lost
    assert CheckName.FINAL_MTP_COUNT in failing
    count = next(c for c in report["checks"] if c["name"] == CheckName.STAGE1_MTP_COUNT)
    assert count["findings"][0]["message"] == (
        "stage 1 (HF -> Megatron): Megatron declares 0 (mtp_num_layers: null), the source 1"
    )


KEPT = "dtype changed BF16 -> F32 (every value kept: the wider type holds each exactly)"


def test_hy_v3_router_bias_is_widened_to_float32(run_cli, tmp_path: Path) -> None:
    """megatron-core keeps the router's expert bias in F32: the bridge widens HY-V3's BF16
    ``mlp.expert_bias`` (main and MTP layer) and exports it so. Every other tensor maps bit for
    bit; the two changed dtypes are warned of, each named with its values kept, and the gate
    passes: no value was lost."""
    run = run_cli(
        "diff", FIXTURES / "hy_v3", CORPUS / "hy_v3" / "megatron", "--all", "--format", "json"
    )
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    assert fail_messages(report, CheckName.TENSORS, "warn") == {
        "decoder.layers.1.mlp.router.expert_bias": KEPT,
        "mtp.layers.0.transformer_layer.mlp.router.expert_bias": KEPT,
    }
    statuses = [t["status"] for t in report["tensors"]]
    assert (len(statuses), statuses.count("equal")) == (51, 49)
    round_trip = replay_roundtrip(run_cli, CORPUS, "hy_v3", tmp_path)
    assert failing_checks(round_trip) == {}
    assert list(fail_messages(round_trip, CheckName.STAGE1_TENSORS, "warn")) == [
        "mtp.layers.0.transformer_layer.mlp.router.expert_bias"
    ]
    assert list(fail_messages(round_trip, CheckName.ROUNDTRIP_TENSORS, "warn")) == [
        "model.layers.2.mlp.expert_bias"
    ]


def test_a_vision_language_checkpoint_is_judged_under_its_language_model_names(
    run_cli, tmp_path: Path
) -> None:
    """Megatron-Bridge writes Qwen3.5-MoE (VLM) as ``language_model.*`` beside
    ``vision_model.*``, in F32 (its VL bridge reads the dtype from ``text_config``, where the
    fixture has none). The MTP layer is found under the language model's names, the MTP
    block's fused experts (``gate_up_proj`` [E, 2I, H]) are compared expert by expert, every
    value is kept and every tensor is warned of for its widened dtype; the vision tower, which no
    rule maps, is named as not compared."""
    megatron = CORPUS / "qwen3_5_moe" / "megatron"
    inspected = run_cli("inspect", megatron, "--format", "json")
    assert inspected.exit_code == 0, inspected
    (summary,) = json.loads(inspected.stdout)["inputs"]
    assert summary["declared_mtp_layers"] == 1
    assert [layer["complete"] for layer in summary["mtp_layers"]] == [True]
    assert all(not t.startswith("language_model.") for t in summary["mtp_layers"][0]["tensors"])

    run = run_cli("diff", FIXTURES / "qwen3_5_moe", megatron, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    assert fail_messages(report, CheckName.TENSORS) == {}
    widened = fail_messages(report, CheckName.TENSORS, "warn")
    assert len(widened) == 24 and set(widened.values()) == {KEPT}
    experts = [n for n in widened if ".experts.local_experts." in n]
    assert len(experts) == 8  # 4 experts x (fc1, fc2), cut from two fused HF tensors

    everything = json.loads(
        run_cli("diff", FIXTURES / "qwen3_5_moe", megatron, "--all", "--format", "json").stdout
    )
    outside = next(
        f
        for c in everything["checks"]
        for f in c["findings"]
        if f["subject"] == "outside the mapping"
    )
    assert outside["status"] == "skip"
    names = outside["details"]["names"]
    assert len(names) == 42
    assert all(n.startswith(("model.visual.", "vision_model.")) for n in names)
    assert {t["status"] for t in everything["tensors"]} == {"dtype_changed"}
    assert {t["values_differing"] for t in everything["tensors"]} == {0}

    round_trip = replay_roundtrip(run_cli, CORPUS, "qwen3_5_moe", tmp_path)
    stage1 = fail_messages(round_trip, CheckName.STAGE1_TENSORS, "warn")
    assert len(stage1) == 24
    assert all(m.startswith(f"stage 1 (HF -> Megatron): {KEPT} [from ") for m in stage1.values())
    assert failing_checks(round_trip) == {}


def test_a_flipped_bit_in_a_nested_hybrid_mtp_layer_is_named(run_cli, tmp_path: Path) -> None:
    """Nemotron-H's MTP depth is a stack of layers (pattern ``*E``), which megatron-core
    nests as ``mtp.layers.0.mtp_model_layer.layers.{t}``: one bit flipped on disk in the
    second (MoE) layer's router is named under that layer's canonical name."""
    damaged = tmp_path / "megatron"
    shutil.copytree(CORPUS / "nemotron_h" / "megatron", damaged)
    name = "mtp.layers.0.transformer_layer.layers.1.mlp.router.weight"
    (span, *_rest) = open_checkpoint(damaged, False).byte_spans(name)
    flip_bit(Path(span.file), span.offset + 3, bit=2)
    run = run_cli("diff", FIXTURES / "nemotron_h", damaged, "--format", "json")
    assert run.exit_code == 1, run
    (message,) = fail_messages(json.loads(run.stdout), CheckName.TENSORS).values()
    assert list(fail_messages(json.loads(run.stdout), CheckName.TENSORS)) == [name]
    assert message.startswith("bits differ in 1 of 64 elements, first at index [0, 1]")
