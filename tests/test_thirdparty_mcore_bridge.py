"""Verdicts on what ModelScope's mcore-bridge 1.6.5 (megatron-core 0.19.2) really writes.

``tests/data/mcore_bridge/<case>/`` holds, per shipped fixture, the Megatron checkpoint
mcore-bridge wrote from it (``megatron/``, saved the way ms-swift 4.6 saves it) and the HF
checkpoint it exported from that (``hf/``), on CPU, by ``tests/thirdparty/mcore_bridge/``
(``regenerate.sh``; its NOTES.md lists every shim, none of which changes a weight). mcore-bridge
takes the MTP depth from the user's arguments only: ``-mtp1`` cases were converted with
``mtp_num_layers = 1`` (ms-swift's ``--mtp_num_layers 1``), the others without, as a user who
does not know to pass it (ms-swift issue 9504). The round trips replay the recorded output as
the user's converter commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES
from tests.thirdparty.replay import fail_messages, failing_checks, replay_roundtrip, source_of

CORPUS = Path(__file__).resolve().parent / "data" / "mcore_bridge"
SWIFT = ("--megatron-layout", "mcore-bridge")
CLEAN = {  # case -> (tensors of `diff SOURCE MEGATRON --all`, all bit-identical; layout option)
    "deepseek_v3-mtp1": (60, ()),
    "accept_deepseek_v3-mtp1": (60, ()),
    "glm4_moe-mtp1": (54, ()),
    "glm_moe_dsa-mtp1": (75, ()),
    "qwen3_next-mtp1": (63, SWIFT),
    "accept_qwen3_next-mtp1": (63, SWIFT),
    "qwen3_5_moe-mtp1": (103, SWIFT),
}
KEPT = "dtype changed BF16 -> F32 (every value kept: the wider type holds each exactly)"
MOVED = (
    "bit-identical to A while the last main layer moved (decoder.layers.3.*: 2 of 3 tensors "
    "outside its routed experts differ): if B is A converted, the conversion changed the main "
    "model (`diff --all` names every tensor); if B was trained or merged from A, its drafter was "
    "kept from the base and drafts from hidden states this model no longer produces (`mtpcheck "
    "accept` measures what it still earns)"
)


def test_versions_recorded() -> None:
    for case in CLEAN:
        versions = json.loads((CORPUS / case / "convert.json").read_text())["versions"]
        assert (versions["mcore-bridge"], versions["megatron-core"]) == ("1.6.5", "0.19.2")


@pytest.mark.parametrize("case", sorted(CLEAN))
def test_the_megatron_output_maps_bit_for_bit(run_cli, case: str) -> None:
    count, layout = CLEAN[case]
    inspected = run_cli("inspect", CORPUS / case / "megatron", "--format", "json")
    assert inspected.exit_code == 0, inspected
    megatron = CORPUS / case / "megatron"
    run = run_cli("diff", source_of(case), megatron, "--all", *layout, "--format", "json")
    assert run.exit_code == 0, run
    tensors = json.loads(run.stdout)["tensors"]
    assert len(tensors) == count
    assert {t["status"] for t in tensors} == {"equal"}


def test_its_gated_delta_net_is_not_megatron_cores(run_cli) -> None:
    """Without ``--megatron-layout mcore-bridge``, Qwen3-Next is judged in megatron-core's
    layout, which mcore-bridge's own modules do not use: exactly the tensors the two lay out
    differently fail, nothing else."""
    megatron = CORPUS / "qwen3_next-mtp1" / "megatron"
    run = run_cli("diff", FIXTURES / "qwen3_next", megatron, "--all", "--format", "json")
    assert run.exit_code == 1, run
    assert sorted(fail_messages(json.loads(run.stdout), CheckName.TENSORS)) == [
        "decoder.layers.0.self_attention.conv1d.weight",
        "decoder.layers.0.self_attention.in_proj.weight",
        "decoder.layers.0.self_attention.out_norm.weight",
        "decoder.layers.1.self_attention.linear_qkv.weight",
        "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight",
    ]


@pytest.mark.parametrize("case", ["deepseek_v3-mtp1", "glm_moe_dsa-mtp1", "glm4_moe-mtp1"])
def test_round_trip_through_the_tool_passes(run_cli, case: str, tmp_path: Path) -> None:
    report = replay_roundtrip(run_cli, CORPUS, case, tmp_path)
    assert report["ok"] and failing_checks(report) == {}


@pytest.mark.parametrize(
    ("case", "lost"), [("deepseek_v3", 25), ("glm_moe_dsa", 30), ("hy_v3", 22), ("qwen3_next", 22)]
)
def test_without_the_mtp_argument_the_layer_is_lost(
    run_cli, case: str, lost: int, tmp_path: Path
) -> None:
    """ms-swift 9504: no ``--mtp_num_layers``, no MTP block: every MTP tensor is dropped at
    stage 1, which says so, and the export still declares the layer it lacks."""
    layout = SWIFT if case.startswith("qwen3") else ()
    report = replay_roundtrip(run_cli, CORPUS, case, tmp_path, *layout)
    failing = failing_checks(report)
    assert failing[CheckName.STAGE1_MTP_COUNT] == ["mtp_num_layers"]
    assert len(failing[CheckName.STAGE1_TENSORS]) == lost
    count = next(c for c in report["checks"] if c["name"] == CheckName.STAGE1_MTP_COUNT)
    assert count["findings"][0]["message"] == (
        "stage 1 (HF -> Megatron): Megatron declares 0 (mtp_num_layers: null), the source 1"
    )
    if case != "qwen3_next":  # its source declares no count, nor does the export
        assert CheckName.FINAL_MTP_COUNT in failing


def test_qwen3_next_round_trip_adds_a_count_key(run_cli, tmp_path: Path) -> None:
    """Every tensor comes back bit for bit; the export adds ``num_nextn_predict_layers``,
    which the source did not carry: a config change, named."""
    report = replay_roundtrip(run_cli, CORPUS, "qwen3_next-mtp1", tmp_path, *SWIFT)
    assert failing_checks(report) == {"config": ["num_nextn_predict_layers"]}


def test_qwen3_5_moe_export_swaps_fused_and_per_expert_storage(run_cli, tmp_path: Path) -> None:
    """Stage 1 maps bit for bit (fused MTP experts cut per expert); the export stores the MTP
    block's experts one tensor per expert where the source fused them, so by name the fused
    pair is missing and twelve per-expert tensors are new (their bytes are the fused ones)."""
    report = replay_roundtrip(run_cli, CORPUS, "qwen3_5_moe-mtp1", tmp_path, *SWIFT)
    failing = failing_checks(report)
    assert set(failing) == {"roundtrip-tensors"}
    names = failing[CheckName.ROUNDTRIP_TENSORS]
    assert sorted(n for n in names if n.endswith(("gate_up_proj", "experts.down_proj"))) == [
        "mtp.layers.0.mlp.experts.down_proj",
        "mtp.layers.0.mlp.experts.gate_up_proj",
    ]
    assert len(names) == 2 + 4 * 3


def test_nemotron_h_dense_mlp_layer_is_never_converted(run_cli, tmp_path: Path) -> None:
    """mcore-bridge maps Nemotron-H's Mamba, attention and MoE layers, not its dense MLP
    (``-``) layer, whose Megatron tensors hold whatever memory the model was built on, and its
    HF export leaves that layer out altogether. The MTP block, nested as megatron-core's hybrid
    stack though the saved args do not say so, maps bit for bit; the MTP scope passes, with a
    warning that the last main layer (the dense one) moved while the MTP layer did not, ``--all``
    fails the dense layer and warns of the Mamba parameters it widened to F32 (every value
    kept), and the round trip fails on the export's main model, whatever the scope."""
    megatron = CORPUS / "nemotron_h-mtp1" / "megatron"
    inspected = run_cli("inspect", megatron, "--format", "json")
    assert inspected.exit_code == 0, inspected
    scoped = run_cli("diff", FIXTURES / "nemotron_h", megatron, "--format", "json")
    assert scoped.exit_code == 0
    assert fail_messages(json.loads(scoped.stdout), CheckName.TENSORS, "warn") == {
        "mtp layers": MOVED
    }
    run = run_cli("diff", FIXTURES / "nemotron_h", megatron, "--all", "--format", "json")
    assert run.exit_code == 1, run
    messages = fail_messages(json.loads(run.stdout), CheckName.TENSORS)
    assert fail_messages(json.loads(run.stdout), CheckName.TENSORS, "warn") == {
        "decoder.layers.0.mixer.A_log": KEPT,
        "decoder.layers.0.mixer.D": KEPT,
        "mtp layers": MOVED,
    }
    dense = ["decoder.layers.3.mlp.linear_fc1.weight", "decoder.layers.3.mlp.linear_fc2.weight"]
    assert sorted(messages) == dense
    assert all(messages[n].startswith("bits differ in 512 of 512 elements") for n in dense)
    report = replay_roundtrip(run_cli, CORPUS, "nemotron_h-mtp1", tmp_path)
    assert failing_checks(report) == {"final-main-model": ["main layer 3 (mlp)"]}
    assert fail_messages(report, CheckName.FINAL_MAIN_MODEL) == {
        "main layer 3 (mlp)": "all its tensors missing (no tensor of this layer in the checkpoint)"
    }
    exported = run_cli("inspect", CORPUS / "nemotron_h-mtp1" / "hf", "--format", "json")
    assert exported.exit_code == 1
    assert failing_checks(json.loads(exported.stdout)) == {"main-model": ["main layer 3 (mlp)"]}


def test_an_mtp_layer_the_source_never_had_is_found_untrained(run_cli) -> None:
    """Told to build one MTP layer for MiniMax-M2, whose checkpoint has none, mcore-bridge
    saves the layer as its model initialised it: the norms give it away. Its export writes
    that layer as ``model.layers.2.*``, where no MiniMax-M2 loader looks, under a config that
    declares MTP: the declared layers are reported missing."""
    run = run_cli("inspect", CORPUS / "minimax_m2-mtp1" / "megatron", "--format", "json")
    assert run.exit_code == 1, run
    report = json.loads(run.stdout)
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["mtp-trained"]
    (check,) = [c for c in report["checks"] if c["name"] == CheckName.MTP_TRAINED]
    (finding,) = check["findings"]
    assert finding["message"].startswith("all 5 norms hold their initial value (1.0 in every")
    exported = run_cli("inspect", CORPUS / "minimax_m2-mtp1" / "hf", "--format", "json")
    assert exported.exit_code == 1, exported
    checks = json.loads(exported.stdout)["checks"]
    failing = {c["name"] for c in checks if c["status"] == "fail"}
    assert failing == {CheckName.MAIN_MODEL, CheckName.MTP_COUNT, CheckName.MTP_LAYERS}
    # the export also left out three tensors of every main layer, which no peer still held:
    # MiniMax-M2's definition names them (transformers' MiniMaxM2ForCausalLM)
    (main,) = [c for c in checks if c["name"] == CheckName.MAIN_MODEL]
    lost = ("block_sparse_moe.e_score_correction_bias", "self_attn.k_norm.weight",
            "self_attn.q_norm.weight")  # fmt: skip
    assert [f["subject"] for f in main["findings"]] == ["main layer 0", "main layer 1"]
    for k, finding in enumerate(main["findings"]):
        assert finding["message"].startswith("3 tensor(s) its definition holds missing")
        assert finding["message"].endswith(", ".join(f"model.layers.{k}.{n}" for n in lost))
