"""Checkpoints written by mbridge 0.15.1 (``mbridge.AutoBridge``), not by mtpcheck.

mbridge runs on CPU through ``tests/thirdparty/mbridge_convert.py`` (its CUDA and Transformer
Engine needs shimmed there, never in mtpcheck) as the round trip's converter in both directions.
One round trip per family, its checkpoints kept for ``inspect`` and ``diff``. What it does to
the shipped fixtures, and what each test pins:

* GLM-4.5: ``GLM4MoEBridge`` never builds an MTP block, so stage 1 writes no ``mtp.*`` tensor and
  the exported checkpoint lacks all 34 ``model.layers.2.*`` tensors while its config still
  declares the layer. The Megatron output declares no count at all (``common.pt`` is ``{}``),
  so ``inspect`` alone passes it.
* MiMo: stock ``MimoBridge`` cannot build the model (it passes its TransformerConfig as the MTP
  layer spec); with ``--compat`` it converts, and the final checkpoint is bit-identical to the
  source, but stage 1 copies ``input_proj`` (which multiplies cat(hidden, embedding)) into
  Megatron's ``eh_proj`` (cat(embedding, hidden)) without swapping its halves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.checks.roundtrip_checks import SCOPE_MEGATRON
from tests.conftest import FIXTURES, Run
from tests.thirdparty.runs import MBRIDGE, Kept, Roundtrips
from tests.thirdparty.runs import failing as _failing
from tests.thirdparty.runs import findings as _findings
from tests.thirdparty.runs import statuses as _statuses
from tests.thirdparty.tools import require

pytestmark = pytest.mark.slow  # runs a third-party converter

STAGE1 = "stage 1 (HF -> Megatron)"

GLM_HF_MTP = frozenset(
    [
        *(
            f"model.layers.2.{n}.weight"
            for n in ("eh_proj", "enorm", "hnorm", "embed_tokens", "shared_head.head")
        ),
        "model.layers.2.shared_head.norm.weight",
        "model.layers.2.input_layernorm.weight",
        "model.layers.2.post_attention_layernorm.weight",
        *(f"model.layers.2.self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")),
        "model.layers.2.self_attn.o_proj.weight",
        "model.layers.2.self_attn.q_norm.weight",
        "model.layers.2.self_attn.k_norm.weight",
        "model.layers.2.mlp.gate.weight",
        "model.layers.2.mlp.gate.e_score_correction_bias",
        *(f"model.layers.2.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(
            f"model.layers.2.mlp.experts.{e}.{p}_proj.weight"
            for e in range(4)
            for p in ("gate", "up", "down")
        ),
    ]
)
_LAYER = "mtp.layers.0.transformer_layer."
GLM_MEGATRON_MTP = frozenset(
    [
        *(f"mtp.layers.0.{n}.weight" for n in ("eh_proj", "enorm", "hnorm", "final_layernorm")),
        *(
            f"{_LAYER}{n}"
            for n in (
                "input_layernorm.weight",
                "pre_mlp_layernorm.weight",
                "self_attention.linear_qkv.weight",
                "self_attention.linear_qkv.bias",
                "self_attention.linear_proj.weight",
                "self_attention.q_layernorm.weight",
                "self_attention.k_layernorm.weight",
                "mlp.router.weight",
                "mlp.router.expert_bias",
                "mlp.shared_experts.linear_fc1.weight",
                "mlp.shared_experts.linear_fc2.weight",
            )
        ),
        *(
            f"{_LAYER}mlp.experts.local_experts.{e}.linear_fc{i}.weight"
            for e in range(4)
            for i in (1, 2)
        ),
    ]
)
MIMO_EH_PROJ = "bits differ in 512 of 512 elements, first at index [0, 0]; max abs diff 0.0754395"
UNDECLARED = "no mtp_num_layers in config"


@pytest.fixture(scope="module")
def glm(thirdparty_runs: Roundtrips) -> Kept:
    return thirdparty_runs.get("mbridge-glm4_moe")


@pytest.fixture(scope="module")
def mimo(thirdparty_runs: Roundtrips) -> Kept:
    return thirdparty_runs.get("mbridge-mimo")


def _json(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


# --- GLM-4.5: stock mbridge drops the MTP layer in stage 1 --------------------------------------


def test_glm_roundtrip_verdicts(glm: Kept) -> None:
    assert glm.exit_code == 1, glm
    assert _statuses(glm.report) == {
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
        CheckName.STAGE1_MTP_COUNT: "fail",
        CheckName.STAGE1_TENSORS: "fail",
        CheckName.STAGE2_CONVERT: "pass",
        CheckName.CONFIG: "pass",
        CheckName.ROUNDTRIP_TENSORS: "fail",
        CheckName.FINAL_MAIN_MODEL: "pass",
        CheckName.FINAL_MTP_COUNT: "fail",
    }


def test_glm_megatron_output_declares_no_count_and_holds_no_mtp(glm: Kept) -> None:
    megatron = glm.report["inputs"][1]
    assert megatron["format"] == "megatron-torch-dist"
    assert (megatron["declared_mtp_layers"], megatron["declared_by"]) == (None, UNDECLARED)
    assert megatron["mtp_layers"] == []
    assert megatron["tensor_count"] == 31
    assert _failing(glm.report, CheckName.STAGE1_MTP_COUNT) == {
        "mtp_num_layers": f"{STAGE1}: Megatron output records no MTP count ({UNDECLARED}) and "
        "holds 0 complete MTP layer(s); the source declares 1"
    }


def test_glm_stage1_names_every_missing_megatron_tensor(glm: Kept) -> None:
    findings = _findings(glm.report, "stage1-tensors")
    assert findings[0]["message"] == (
        f"2 of 25 MTP-scope tensors bit-identical to the mapped source ({SCOPE_MEGATRON})"
    )
    failing = _failing(glm.report, CheckName.STAGE1_TENSORS)
    assert set(failing) == GLM_MEGATRON_MTP and len(failing) == 23
    assert {f["details"]["status"] for f in findings[1:]} == {"missing"}
    assert failing["mtp.layers.0.eh_proj.weight"] == (
        f"{STAGE1}: missing in Megatron output (was BF16[16, 32]) "
        "[from model.layers.2.eh_proj.weight]"
    )
    assert failing[f"{_LAYER}self_attention.linear_qkv.weight"] == (
        f"{STAGE1}: missing in Megatron output (was BF16[32, 16]) [from "
        "model.layers.2.self_attn.q_proj.weight + model.layers.2.self_attn.k_proj.weight + "
        "model.layers.2.self_attn.v_proj.weight]"
    )


def test_glm_final_loses_all_34_mtp_tensors_blamed_on_stage_1(glm: Kept) -> None:
    source = glm.report["inputs"][0]
    (layer,) = source["mtp_layers"]
    assert set(layer["tensors"]) == GLM_HF_MTP and len(GLM_HF_MTP) == 34
    findings = _findings(glm.report, "roundtrip-tensors")
    assert findings[0]["message"] == (
        "45 of 79 final tensors bit-identical to the source (every tensor)"
    )
    failing = _failing(glm.report, CheckName.ROUNDTRIP_TENSORS)
    assert set(failing) == GLM_HF_MTP
    assert all(m.startswith(STAGE1) for m in failing.values()), failing
    assert {(f["details"]["status"], f["details"]["stage"]) for f in findings[1:]} == {
        ("missing", 1)
    }
    assert failing["model.layers.2.eh_proj.weight"] == (
        f"{STAGE1} (as mtp.layers.0.eh_proj.weight): missing in final (was BF16[16, 32])"
    )
    # the copies of embedding and head have no Megatron name: blamed on stage 1 with the layer
    assert failing["model.layers.2.shared_head.head.weight"] == (
        f"{STAGE1}: missing in final (was BF16[64, 16])"
    )
    assert failing["model.layers.2.mlp.gate.e_score_correction_bias"] == (
        f"{STAGE1} (as {_LAYER}mlp.router.expert_bias): missing in final (was F32[4])"
    )
    statuses = {t["name"]: t["status"] for t in glm.report["tensors"]}
    assert {n for n, s in statuses.items() if s != "equal"} == GLM_HF_MTP


def test_glm_final_config_still_declares_the_lost_layer(glm: Kept) -> None:
    final = glm.report["inputs"][2]
    assert (final["declared_mtp_layers"], final["tensor_count"]) == (1, 45)
    assert _failing(glm.report, CheckName.CONFIG) == {}
    assert _failing(glm.report, CheckName.FINAL_MTP_COUNT) == {
        "mtp-count": "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the "
        "checkpoint holds no MTP weights"
    }


def test_glm_inspect_of_the_megatron_output_cannot_see_the_loss(run_cli, glm: Kept) -> None:
    """Nothing declares a count in an mbridge checkpoint, so no MTP present is consistent."""
    run = run_cli("inspect", glm.megatron, "--format", "json")
    assert run.exit_code == 0, run
    report = _json(run)
    assert set(_statuses(report).values()) <= {"pass", "skip"}
    ((finding,),) = [c["findings"] for c in report["checks"] if c["name"] == CheckName.MTP_COUNT]
    assert finding["message"] == f"no MTP layers declared ({UNDECLARED}); none present"


def test_glm_inspect_of_the_final_checkpoint_fails(run_cli, glm: Kept) -> None:
    run = run_cli("inspect", glm.hf, "--format", "json")
    assert run.exit_code == 1, run
    report = _json(run)
    assert {n for n, s in _statuses(report).items() if s == "fail"} == {
        CheckName.MTP_COUNT,
        CheckName.MTP_LAYERS,
    }
    (message,) = _failing(report, CheckName.MTP_LAYERS).values()
    assert message.startswith("model.layers.2.: 32 of 32 tensors missing: ")


def test_glm_diff_source_against_megatron_names_the_missing_mtp(run_cli, glm: Kept) -> None:
    run = run_cli("diff", FIXTURES / "glm4_moe", glm.megatron, "--format", "json")
    assert run.exit_code == 1, run
    report = _json(run)
    assert _failing(report, CheckName.CONFIG) == {"mtp_num_layers": "1 -> None"}
    failing = _failing(report, CheckName.TENSORS)
    assert set(failing) == GLM_MEGATRON_MTP
    assert failing["mtp.layers.0.eh_proj.weight"] == "missing in B (was BF16[16, 32])"
    assert all(m.startswith("missing in B (was ") for m in failing.values()), failing


# --- MiMo: --compat builds it; the final checkpoint is exact, the Megatron one is not ----------


def test_mimo_stock_mbridge_cannot_build_the_model(run_cli, tmp_path: Path) -> None:
    require("mbridge")
    run = run_cli(
        "roundtrip",
        FIXTURES / "mimo",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-megatron",
        f"{MBRIDGE} import {{src}} {{dst}}",
    )
    assert run.exit_code == 1, run
    ((subject, message),) = _failing(_json(run), CheckName.STAGE1_CONVERT).items()
    assert subject == STAGE1
    assert message.startswith("converter exited with status 1; stderr tail:\n"), message
    assert "ValueError: Invalid spec: TransformerConfig(" in message
    assert list(tmp_path.iterdir()) == []


def test_mimo_roundtrip_verdicts(mimo: Kept) -> None:
    assert mimo.exit_code == 1, mimo
    assert _statuses(mimo.report) == {
        CheckName.SOURCE_INTEGRITY: "pass",
        CheckName.SOURCE_FAMILY: "pass",
        CheckName.SOURCE_MTP_COUNT: "pass",
        CheckName.SOURCE_MTP_LAYERS: "pass",
        CheckName.SOURCE_MTP_SHAPES: "pass",
        CheckName.SOURCE_SHARED_COPIES: "skip",  # MiMo stores no copies
        CheckName.SOURCE_MTP_TRAINED: "pass",
        CheckName.SOURCE_SERVING: "skip",
        CheckName.SOURCE_MAIN_MODEL: "pass",
        CheckName.SOURCE_MCORE_MODEL: "pass",
        CheckName.STAGE1_CONVERT: "pass",
        CheckName.STAGE1_MTP_COUNT: "warn",  # a bare dist_checkpointing.save records no args
        CheckName.STAGE1_TENSORS: "fail",
        CheckName.STAGE2_CONVERT: "pass",
        CheckName.CONFIG: "pass",
        CheckName.ROUNDTRIP_TENSORS: "pass",
        CheckName.FINAL_MAIN_MODEL: "pass",
        CheckName.FINAL_MTP_COUNT: "pass",
    }
    ((count,),) = [
        c["findings"] for c in mimo.report["checks"] if c["name"] == CheckName.STAGE1_MTP_COUNT
    ]
    assert count["message"] == (
        f"{STAGE1}: Megatron output records no MTP count ({UNDECLARED}); it holds 1 complete "
        "MTP layer(s), as the source declares"
    )


def test_mimo_final_checkpoint_is_bit_identical(mimo: Kept) -> None:
    assert {t["status"] for t in mimo.report["tensors"]} == {"equal"}
    assert len(mimo.report["tensors"]) == 43
    (head,) = _findings(mimo.report, "roundtrip-tensors")
    assert head["message"] == ("43 of 43 final tensors bit-identical to the source (every tensor)")


def test_mimo_stage1_keeps_input_proj_halves_in_hf_order(mimo: Kept) -> None:
    findings = _findings(mimo.report, "stage1-tensors")
    assert findings[0]["message"] == (
        f"12 of 13 MTP-scope tensors bit-identical to the mapped source ({SCOPE_MEGATRON})"
    )
    assert _failing(mimo.report, CheckName.STAGE1_TENSORS) == {
        "mtp.layers.0.eh_proj.weight": (
            f"{STAGE1}: {MIMO_EH_PROJ} [from model.mtp_layers.0.input_proj.weight]"
        )
    }


def _raw(tensor: Any) -> bytes:
    import torch

    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_mimo_eh_proj_is_input_proj_unswapped(mimo: Kept) -> None:
    """The stage 1 difference is exactly the missing half swap, nothing else."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import FileSystemReader, load

    name = "mtp.layers.0.eh_proj.weight"
    reader = FileSystemReader(str(mimo.megatron))
    shape = reader.read_metadata().state_dict_metadata[name].size
    state = {name: torch.empty(shape, dtype=torch.bfloat16)}
    load(state, storage_reader=reader, no_dist=True)
    hf = load_file(FIXTURES / "mimo" / "model.safetensors")["model.mtp_layers.0.input_proj.weight"]
    assert _raw(state[name]) == _raw(hf)
    first, second = hf.chunk(2, dim=1)
    assert _raw(state[name]) != _raw(torch.cat((second, first), dim=1))


def test_mimo_inspect_of_the_megatron_output(run_cli, mimo: Kept) -> None:
    run = run_cli("inspect", mimo.megatron, "--format", "json")
    report = _json(run)
    (layer,) = report["inputs"][0]["mtp_layers"]
    assert (layer["index"], layer["complete"], len(layer["tensors"])) == (0, True, 11)
    assert _statuses(report)[CheckName.MTP_LAYERS] == "pass"
    # the layer is complete; nothing records the count, which the loader must then be given
    assert run.exit_code == 0, run
    ((count,),) = [c["findings"] for c in report["checks"] if c["name"] == CheckName.MTP_COUNT]
    assert (count["status"], count["message"]) == (
        "warn",
        f"1 MTP layer(s) present (1 complete) but the checkpoint records no MTP count "
        f"({UNDECLARED}); load it with --mtp-num-layers 1",
    )


def test_mimo_diff_source_against_megatron(run_cli, mimo: Kept) -> None:
    run = run_cli("diff", FIXTURES / "mimo", mimo.megatron, "--format", "json")
    assert run.exit_code == 1, run
    report = _json(run)
    assert _failing(report, CheckName.CONFIG) == {"mtp_num_layers": "1 -> None"}
    assert _failing(report, CheckName.TENSORS) == {"mtp.layers.0.eh_proj.weight": MIMO_EH_PROJ}


def test_mimo_diff_source_against_final_passes(run_cli, mimo: Kept) -> None:
    run = run_cli("diff", FIXTURES / "mimo", mimo.hf, "--all", "--format", "json")
    assert run.exit_code == 0, run
    assert set(_statuses(_json(run)).values()) == {"pass"}
