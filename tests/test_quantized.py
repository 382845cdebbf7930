"""Quantized releases written by the real tools (``fixtures/quantized``, made by
``fixtures/make_quantized.py`` with llm-compressor 0.14 / compressed-tensors 0.19 and NVIDIA
modelopt 0.47 from the shipped fixtures): every output that kept its MTP layer passes, every
one that lost it fails with the exact finding, and ``diff`` reports quantized tensors as such."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run

CORPUS = FIXTURES / "quantized"
CASES: dict[str, dict[str, Any]] = json.loads((CORPUS / "MANIFEST.json").read_text())["cases"]
KEPT = sorted(k for k, v in CASES.items() if v["mtp"] != "lost")
LOST = sorted(k for k, v in CASES.items() if v["mtp"] == "lost")


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def _findings(report: dict[str, Any], check: str) -> list[tuple[str, str, str]]:
    return [
        (f["status"], f["subject"], f["message"])
        for c in report["checks"]
        if c["name"] == check
        for f in c["findings"]
    ]


def _source(case: str) -> Path:
    return FIXTURES / Path(CASES[case]["source_fixture"]).name


def test_corpus_covers_each_tool_scheme_and_fate() -> None:
    fates = {v["mtp"] for v in CASES.values()}
    assert fates == {"quantized", "ignored-bf16", "lost", "copied-back-bf16"}
    schemes = {(v["tool"], v["scheme"]) for v in CASES.values()}
    for scheme in ("FP8_DYNAMIC", "FP8_BLOCK", "W4A16", "NVFP4A16"):
        assert ("llmcompressor", scheme) in schemes
    assert {v["flow"] for v in CASES.values()} >= {"oneshot", "model_free_ptq"}
    assert {v["tool"] for v in CASES.values()} == {"llmcompressor", "nvidia-modelopt"}
    assert len(KEPT) >= 20 and len(LOST) >= 10


@pytest.mark.parametrize("case", KEPT)
def test_every_output_that_kept_its_mtp_layer_passes(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    [(status, subject, message)] = _findings(report, CheckName.MTP_QUANTIZATION)
    assert (status, subject) == ("pass", "mtp layer 0")
    fate = CASES[case]["mtp"]
    if fate == "quantized":
        assert ", like the main layers, under " in message, message
        assert not message.startswith("stored BF16"), message
    else:  # kept in BF16, and the config's ignore list says so
        assert message.startswith("stored BF16 where the main layers are "), message
        entry = message.rsplit("kept in full precision by ignore entry ", 1)[1].strip("'")
        written = CASES[case]["written_ignore"] or CASES[case]["written_exclude_modules"]
        assert entry in written


@pytest.mark.parametrize("case", LOST)
def test_every_output_that_lost_its_mtp_layer_fails_on_the_count(case: str, run_cli) -> None:
    run = run_cli("inspect", CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    report = _report(run)
    declared = report["inputs"][0]["declared_by"]
    first = next(f for c in report["checks"] for f in c["findings"] if f["status"] == "fail")
    assert (first["subject"], first["message"]) == (
        "mtp-count",
        f"config declares 1 MTP layer(s) ({declared}) but the checkpoint holds no MTP weights",
    )
    assert CASES[case]["mtp_tensors"] == []


# --- diff across a quantization -----------------------------------------------------------


@pytest.mark.parametrize("case", KEPT)
def test_diff_reports_quantized_tensors_as_quantized_and_dequantizes_them(
    case: str, run_cli
) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    report = _report(run)
    statuses = {t["status"] for t in report["tensors"]}
    assert statuses <= {"equal", "quantized"}, statuses
    quantized = [t for t in report["tensors"] if t["status"] == "quantized"]
    assert quantized, "the main layers are quantized"
    for t in quantized:
        # rounded to nearest, with a scale itself rounded to its stored dtype
        assert t["steps"] is not None and 0 <= t["steps"] <= 0.6, t
    hidden = report["inputs"][0]["num_hidden_layers"]
    mtp = {t["name"] for t in quantized if f"layers.{hidden}." in t["name"] or "mtp." in t["name"]}
    assert bool(mtp) == (CASES[case]["mtp"] == "quantized"), sorted(mtp)


def test_steps_are_shown_with_three_decimals(run_cli) -> None:
    # 0.520 steps once read "within 0.52 steps" beside "within 0.521 steps" (measured from the
    # last point of the grid where W4A16 clips, those figures are now 0.510 and 0.515)
    case = "llmc-mfptq-deepseek_v3-w4a16-quantized"
    run = run_cli("diff", _source(case), CORPUS / case, "--all", "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    messages = [f["message"] for c in _report(run)["checks"] for f in c["findings"]]
    shown = [m.split("within ")[1].split(" steps")[0] for m in messages if " steps of A" in m]
    assert len(shown) > 10
    assert all(len(s.split(".")[1]) == 3 for s in shown), shown
    assert "0.510" in shown  # a figure that would lose its zero


def test_experts_unpacked_and_quantized_are_one_quantized_tensor(run_cli) -> None:
    """model_free_ptq writes Qwen3.5-MoE's fused MTP experts as one FP8 tensor per expert and
    projection: the fused tensor is reported quantized, each expert measured against its rows."""
    case = "llmc-mfptq-qwen3_5_moe-fp8_dynamic-quantized"
    run = run_cli("diff", _source(case), CORPUS / case, "--dequantize", "--format", "json")
    assert run.exit_code == 0, run
    rows = {t["name"]: t for t in _report(run)["tensors"]}
    fused = rows["mtp.layers.0.mlp.experts.gate_up_proj"]
    assert fused["status"] == "quantized" and fused["storage"] == [
        "BF16, 4 experts fused",
        "FP8, one gate_proj + up_proj per expert",
    ]
    assert 0 <= fused["steps"] <= 0.6
    assert not any(".experts.0." in name for name in rows)  # no expert left over as "extra"


@pytest.mark.parametrize("case", LOST)
def test_diff_names_the_lost_mtp_tensors_missing(case: str, run_cli) -> None:
    run = run_cli("diff", _source(case), CORPUS / case, "--format", "json")
    assert run.exit_code == 1, run
    missing = {t["name"] for t in _report(run)["tensors"] if t["status"] == "missing"}
    family_mtp = "mtp.fc.weight" if "qwen" in case else "model.layers.2.eh_proj.weight"
    assert family_mtp in missing


def _swap_packed_rows(case_dir: Path, name: str) -> None:
    """Reverse the rows of one stored tensor in place (same dtype, shape and size: a layer
    that holds another layout of the data, as a broken conversion writes)."""
    import torch
    from safetensors.torch import load_file, save_file

    for shard in sorted(case_dir.glob("*.safetensors")):
        tensors = load_file(shard)
        if name in tensors:
            tensors[name] = torch.flip(tensors[name], dims=[0]).contiguous()
            save_file(tensors, str(shard))
            return
    raise AssertionError(f"{name} not in {case_dir}")


@pytest.mark.parametrize(
    ("case", "stored"),
    [
        ("llmc-mfptq-deepseek_v3-w4a16-quantized", "model.layers.2.eh_proj.weight_packed"),
        ("llmc-mfptq-qwen3_next-fp8_block-quantized", "mtp.fc.weight"),
        ("llmc-mfptq-qwen3_next-nvfp4a16-quantized", "mtp.fc.weight_packed"),
    ],
)
def test_dequantize_finds_a_quantized_mtp_tensor_that_is_not_the_original(
    case: str, stored: str, tmp_path: Path, run_cli
) -> None:
    damaged = Path(shutil.copytree(CORPUS / case, tmp_path / case))
    _swap_packed_rows(damaged, stored)
    plain = run_cli("diff", _source(case), damaged, "--format", "json")
    assert plain.exit_code == 0, plain  # stored quantized: no byte comparison can tell
    run = run_cli("diff", _source(case), damaged, "--dequantize", "--format", "json")
    assert run.exit_code == 1, run
    logical = stored.removesuffix("_packed")
    [(status, message)] = [
        (s, m) for s, subject, m in _findings(_report(run), CheckName.TENSORS) if subject == logical
    ]
    assert status == "fail"
    assert message.endswith(": the quantized values are not the full-precision ones"), message
    [row] = [t for t in _report(run)["tensors"] if t["name"] == logical]
    assert row["steps"] > 1.0


def _edit_config(case_dir: Path, edit) -> None:
    path = case_dir / "config.json"
    config = json.loads(path.read_text())
    edit(config["quantization_config"])
    path.write_text(json.dumps(config, indent=2))


def test_bf16_mtp_layer_the_config_would_quantize_is_a_finding(tmp_path: Path, run_cli) -> None:
    """vLLM #37667: the backbone quantized, the MTP layer BF16 but not excluded: the engine
    builds it quantized and the BF16 weights never load."""
    case = "llmc-mfptq-qwen3_next-w4a16-ignored-bf16"
    damaged = Path(shutil.copytree(CORPUS / case, tmp_path / case))
    _edit_config(damaged, lambda q: q.update(ignore=[e for e in q["ignore"] if "mtp" not in e]))
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    [(status, subject, message)] = _findings(_report(run), CheckName.MTP_QUANTIZATION)
    assert (status, subject) == ("fail", "mtp layer 0")
    assert message == (
        "mtp.layers.0.mlp.experts.0.down_proj, mtp.layers.0.mlp.experts.0.gate_proj, "
        "mtp.layers.0.mlp.experts.0.up_proj and 16 more: stored BF16, but quantization_config "
        "(compressed-tensors pack-quantized, group 8) quantizes them as it does the main layers "
        "(INT4 (BF16: mlp.gate, mlp.shared_expert_gate)) and no ignore entry matches, so engines "
        "build them quantized and cannot load these weights"
    )


def test_quantized_mtp_layer_the_config_ignores_is_a_finding(tmp_path: Path, run_cli) -> None:
    case = "llmc-mfptq-deepseek_v3-fp8_dynamic-quantized"
    damaged = Path(shutil.copytree(CORPUS / case, tmp_path / case))
    _edit_config(damaged, lambda q: q["ignore"].append("re:model[.]layers[.]2[.].*"))
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    [(status, _, message)] = _findings(_report(run), CheckName.MTP_QUANTIZATION)
    assert status == "fail"
    assert (
        "but quantization_config ignores them (entry 're:model[.]layers[.]2[.].*'), so " in message
    )


def test_modelopt_hf_quant_config_alone_declares_the_scheme(tmp_path: Path, run_cli) -> None:
    """Older modelopt exports describe the quantization only in ``hf_quant_config.json``."""
    case = "modelopt-hfexport-deepseek_v3-fp8-copied-back-bf16"
    copy = Path(shutil.copytree(CORPUS / case, tmp_path / case))
    config = json.loads((copy / "config.json").read_text())
    del config["quantization_config"]
    (copy / "config.json").write_text(json.dumps(config))
    run = run_cli("inspect", copy, "--format", "json")
    assert run.exit_code == 0, run
    [(status, _, message)] = _findings(_report(run), CheckName.MTP_QUANTIZATION)
    assert status == "pass"
    assert message.endswith(
        "under modelopt FP8; kept in full precision by ignore entry 'model.layers.2*'"
    )
    (copy / "hf_quant_config.json").unlink()  # now nothing declares the FP8 main layers
    run = run_cli("inspect", copy, "--format", "json")
    [(status, _, message)] = _findings(_report(run), CheckName.MTP_QUANTIZATION)
    assert status == "pass" and " under " not in message


@pytest.mark.parametrize(
    ("case", "dropped"),
    [
        ("llmc-mfptq-deepseek_v3-w4a16-quantized", "model.layers.2.eh_proj.weight_scale"),
        ("llmc-mfptq-qwen3_next-fp8_block-quantized", "mtp.fc.weight_scale"),
        ("llmc-mfptq-qwen3_next-nvfp4a16-quantized", "mtp.fc.weight_global_scale"),
    ],
)
def test_a_quantized_mtp_only_tensor_without_its_scale_is_incomplete(
    case: str, dropped: str, tmp_path: Path, run_cli
) -> None:
    """The projection only the MTP layer has, stored quantized, needs the side parts the main
    layers' weights of the same form hold; a converter that drops one loses the layer."""
    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(CORPUS / case, tmp_path / case))
    for shard in sorted(copy.glob("*.safetensors")):
        tensors = load_file(shard)
        if dropped in tensors:
            del tensors[dropped]
            save_file(tensors, str(shard))
    index = copy / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        del data["weight_map"][dropped]
        index.write_text(json.dumps(data))
    run = run_cli("inspect", copy, "--format", "json")
    assert run.exit_code == 1, run
    [(status, _, message)] = _findings(_report(run), CheckName.MTP_LAYERS)
    assert status == "fail" and message.endswith(f"tensors missing: {dropped}"), message


@pytest.mark.parametrize("case", [k for k in KEPT if CASES[k]["mtp"] == "quantized"])
def test_an_intact_quantized_source_is_refused_by_the_converters(
    case: str, run_cli, tmp_path: Path
) -> None:
    """The HF <-> Megatron mapping moves full-precision weights: convert and roundtrip refuse
    an intact quantized source in one line naming its scheme (exit 2), before any work, and
    leave nothing behind."""
    source = CORPUS / case
    declared = json.loads((source / "config.json").read_text())["quantization_config"]
    scheme = ", ".join([declared["quant_method"], declared["format"]])
    reason = (
        f"the source is quantized ({scheme}): the HF <-> Megatron mapping converts "
        "full-precision weights only; compare a quantized copy with its source with "
        "`mtpcheck diff SRC QUANTIZED --dequantize`"
    )
    dst = tmp_path / "out" / "megatron"
    converted = run_cli("convert", "hf-to-megatron", source, dst)
    assert (converted.exit_code, converted.stdout) == (2, ""), converted
    assert converted.stderr == f"mtpcheck: error: {source}: {reason}\n"
    assert not (tmp_path / "out").exists()
    work = tmp_path / "work"
    tripped = run_cli("roundtrip", source, "--workdir", work)
    assert (tripped.exit_code, tripped.stdout) == (2, ""), tripped
    assert tripped.stderr.splitlines()[-1] == f"mtpcheck: error: {source}: {reason}"
    assert list(work.iterdir()) == []


def test_a_damaged_quantized_source_gets_its_damage_findings(run_cli, tmp_path: Path) -> None:
    source = CORPUS / "llmc-oneshot-deepseek_v3-fp8_dynamic-lost"
    converted = run_cli("convert", "hf-to-megatron", source, tmp_path / "out")
    assert converted.exit_code == 1, converted
    assert converted.stderr.startswith(
        f"mtpcheck: refused: {source}: not converted: the source fails its audit: mtp-count: "
    )


def test_equal_scales_of_a_quantized_weight_are_no_copied_tensor(run_cli, tmp_path: Path) -> None:
    """llm-compressor's FP8-block output where an MTP projection's scale equals a main layer's
    byte for byte (a coincidence of quantization, here made so by the safetensors library): a
    side part of a quantized weight, not a block tensor copied from a main layer."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    root = Path(
        shutil.copytree(CORPUS / "llmc-mfptq-deepseek_v3-fp8_block-quantized", tmp_path / "q")
    )
    main, mtp = (f"model.layers.{k}.self_attn.kv_a_proj_with_mqa.weight_scale" for k in (1, 2))
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    scale = load_file(str(root / index[main]))[main]
    shard = root / index[mtp]
    with safe_open(str(shard), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(shard))
    assert tensors[mtp].shape == scale.shape and not tensors[mtp].equal(scale)
    tensors[mtp] = scale.clone()
    save_file(tensors, str(shard), metadata=metadata)
    run = run_cli("inspect", root, "--format", "json")
    assert run.exit_code == 0, run
    [(status, subject, message)] = _findings(_report(run), CheckName.MTP_TRAINED)
    assert (status, subject) == ("pass", "mtp layer 0") and "looks trained" in message
