"""Merges and adapters written by the real tools: peft 0.21's ``merge_and_unload`` +
``save_pretrained`` (``tests/thirdparty/peft``) and mergekit 0.1.5's ``mergekit-yaml`` and
``fill_missing_params`` (``tests/thirdparty/mergekit``), NOTES.md in each. A saved merge loses
the MTP layer while the config keeps declaring it; a drafter restored from the base beside
merged main weights is complete and intact, and ``diff`` warns that it is stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run
from tests.thirdparty.tools import tool_output

DATA = Path(tool_output("peft")).parent
GGUF = Path(__file__).resolve().parent / "data" / "llamacpp_gguf"
LOST = (
    "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint holds no MTP "
    "weights"
)
STALE = (
    "bit-identical to A while the last main layer moved (model.layers.1.*: {moved} of {of} "
    "tensors outside its routed experts differ): a drafter kept from the base (a merge's "
    "fill_missing_params, a fine-tune that copies the MTP layer back) drafts from hidden "
    "states this model no longer produces; measure what it still earns with `mtpcheck accept`"
)
STALE_ACROSS = (
    "bit-identical to A while the last main layer moved (decoder.layers.1.*: {moved} of {of} "
    "tensors outside its routed experts differ): if B is A converted, the conversion changed "
    "the main model (`diff --all` names every tensor); if B was trained or merged from A, its "
    "drafter was kept from the base and drafts from hidden states this model no longer produces "
    "(`mtpcheck accept` measures what it still earns)"
)


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def _findings(report: dict[str, Any], status: str, check: str | None = None) -> list[tuple]:
    return [
        (c["name"], f["subject"], f["message"])
        for c in report["checks"]
        for f in c["findings"]
        if f["status"] == status and check in (None, c["name"])
    ]


@pytest.mark.parametrize(
    "case",
    [
        "peft/deepseek_v3-lora-merged-lost",
        "peft/glm4_moe-lora-merged-lost",
        "mergekit/glm4_moe-linear",
        "mergekit/deepseek_v3-linear-perturbed",
    ],
)
def test_a_saved_merge_loses_the_mtp_layer(case: str, run_cli) -> None:
    run = run_cli("inspect", DATA / case, "--format", "json")
    assert run.exit_code == 1, run
    assert ("mtp-count", "mtp-count", LOST) in _findings(_report(run), "fail")


@pytest.mark.parametrize(
    ("case", "moved", "of"),
    [
        ("peft/deepseek_v3-lora-merged-mtp-copied-back", 5, 14),
        ("peft/glm4_moe-lora-merged-mtp-copied-back", 4, 16),
        ("mergekit/deepseek_v3-linear-perturbed-filled-noindex", 14, 14),
    ],
)
def test_a_drafter_kept_beside_moved_main_weights_is_called_stale(
    case: str, moved: int, of: int, run_cli
) -> None:
    """peft merged LoRA into attention (layer 1's dense MLP and shared expert are not adapted:
    peft 0.21 reads gate/up/down_proj as routed experts), then the MTP layer was copied back;
    mergekit's fill_missing_params restored the base's MTP layer beside a 0.5 / 0.5 merge.
    Both are complete, so inspect passes; diff against the base warns."""
    source = FIXTURES / Path(case).name.split("-")[0]
    inspected = run_cli("inspect", DATA / case, "--format", "json")
    assert inspected.exit_code == 0, inspected
    run = run_cli("diff", source, DATA / case, "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    assert _findings(report, "fail") == []
    warned = _findings(report, "warn", CheckName.TENSORS)
    assert warned == [("tensors", "mtp layers", STALE.format(moved=moved, of=of))]


@pytest.mark.parametrize(
    ("case", "moved", "of"),
    [
        ("peft/deepseek_v3-lora-merged-mtp-copied-back", 5, 13),
        ("mergekit/deepseek_v3-linear-perturbed-filled-noindex", 13, 13),
    ],
)
def test_a_stale_drafter_is_called_stale_across_formats(
    case: str, moved: int, of: int, run_cli, tmp_path: Path
) -> None:
    """The merge written as Megatron torch_dist by the built-in converter, diffed against the
    HF base either way round: the sides are compared in Megatron's names, where the last main
    layer's q/k/v are one fused tensor (so one fewer than in HF's names)."""
    source = FIXTURES / Path(case).name.split("-")[0]
    megatron = tmp_path / "megatron"
    converted = run_cli("convert", "hf-to-megatron", DATA / case, megatron)
    assert converted.exit_code == 0, converted
    stale = STALE_ACROSS.format(moved=moved, of=of)
    for a, b in ((source, megatron), (megatron, source)):
        run = run_cli("diff", a, b, "--format", "json")
        assert run.exit_code == 0, run
        assert _findings(_report(run), "warn", CheckName.TENSORS) == [
            ("tensors", "mtp layers", stale)
        ]
    same = run_cli("diff", DATA / case, megatron, "--format", "json")
    assert same.exit_code == 0 and _findings(_report(same), "warn", CheckName.TENSORS) == []


def test_a_stale_drafter_is_called_stale_in_llama_cpp_names(run_cli) -> None:
    """peft's glm4_moe merge with the base's drafter, converted by llama.cpp's own converter
    (tests/thirdparty/llamacpp, NOTES.md): the same 4 of 16 tensors moved as in HF names, the
    routed experts (``ffn_*_exps``) left out as HF's ``mlp.experts``."""
    case = "peft/glm4_moe-lora-merged-mtp-copied-back"
    (gguf,) = (GGUF / "peft_glm4_moe-mtp-copied-back__bf16__full").glob("*.gguf")
    stale = STALE_ACROSS.replace("decoder.layers.1.", "blk.1.").format(moved=4, of=16)
    run = run_cli("diff", FIXTURES / "glm4_moe", gguf, "--format", "json")
    assert run.exit_code == 0, run
    assert _findings(_report(run), "warn", CheckName.TENSORS) == [("tensors", "mtp layers", stale)]
    shipped = GGUF.parent / case  # what the GGUF was converted from, whatever DATA points at
    same = run_cli("diff", shipped, gguf, "--format", "json")
    assert same.exit_code == 0 and _findings(_report(same), "warn", CheckName.TENSORS) == []


def test_an_unmoved_main_model_is_not_stale(run_cli) -> None:
    """The MTP layer is unchanged, and so is the main model: nothing to warn of."""
    fixture = FIXTURES / "glm4_moe"
    run = run_cli("diff", fixture, fixture, "--format", "json")
    assert run.exit_code == 0 and _findings(_report(run), "warn", CheckName.TENSORS) == []


def test_fill_missing_params_leaves_the_base_index_beside_its_file(run_cli) -> None:
    """fill_missing_params copies the base's shard index next to the single file it writes."""
    run = run_cli(
        "inspect", DATA / "mergekit/deepseek_v3-linear-perturbed-filled", "--format", "json"
    )
    assert run.exit_code == 1, run
    integrity = _findings(_report(run), "fail", CheckName.INTEGRITY)
    assert integrity == [
        (
            "integrity",
            "model-00001-of-00002.safetensors",
            "index names shard model-00001-of-00002.safetensors (39 tensors) but the file is "
            "missing",
        ),
        (
            "integrity",
            "model-00002-of-00002.safetensors",
            "index names shard model-00002-of-00002.safetensors (34 tensors) but the file is "
            "missing",
        ),
        (
            "integrity",
            "model.safetensors",
            "model.safetensors sits beside the index but the index does not mention it",
        ),
    ]


def test_a_restored_drafter_beside_a_merged_embedding_is_caught_by_its_copies(run_cli) -> None:
    """When the merge also moved the embedding and head, the restored MTP layer's stored copies
    no longer equal them: inspect fails on its own, with no base to diff against."""
    case = DATA / "mergekit/deepseek_v3-linear-perturbed-all-filled-noindex"
    run = run_cli("inspect", case, "--format", "json")
    assert run.exit_code == 1, run
    subjects = [s for _, s, _ in _findings(_report(run), "fail", CheckName.SHARED_COPIES)]
    assert subjects == [
        "model.layers.2.embed_tokens.weight",
        "model.layers.2.shared_head.head.weight",
    ]
