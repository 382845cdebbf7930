"""``diff HF GGUF``: an HF checkpoint against what llama.cpp's own converter wrote from it.

The GGUF files are the corpus of ``tests/test_gguf.py`` (``tests/data/llamacpp_gguf``:
llama.cpp ``0c1e57098``'s ``convert_hf_to_gguf.py`` run on the shipped fixtures); the HF side
is the fixture each was converted from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.formats import open_checkpoint
from mtpcheck.mapping.gguf_names import BY_ARCH, plan_gguf
from tests.conftest import FIXTURES, flip_bit
from tests.test_gguf import NEXTN, _gguf
from tests.thirdparty.tools import require

EXPORTED = sorted(NEXTN)
"""Fixtures llama.cpp converts with their nextn layer."""


def _diff(run_cli, *args: str | Path, code: int = 0) -> dict:
    run = run_cli("diff", *args, "--format", "json")
    assert run.exit_code == code, run
    return json.loads(run.stdout)


def _tensor_check(report: dict) -> dict:
    (check,) = [c for c in report["checks"] if c["name"] == CheckName.TENSORS]
    return check


@pytest.mark.parametrize("outtype", ["f32", "bf16"])
@pytest.mark.parametrize("fixture", EXPORTED)
def test_the_mtp_scope_is_bit_identical_to_its_source(run_cli, fixture: str, outtype: str) -> None:
    """F32 and BF16 outputs: every MTP tensor equal byte for byte once named, stacked (the
    experts), widened (BF16 -> F32) and, for Qwen, plus one (the norms) as llama.cpp does."""
    report = _diff(run_cli, FIXTURES / fixture, _gguf(f"{fixture}__{outtype}__full"))
    tensors = report["tensors"]
    assert tensors and {t["status"] for t in tensors} == {"equal"}
    names = {t["name"] for t in tensors}
    block = NEXTN[fixture]
    assert f"blk.{block}.nextn.eh_proj.weight" in names
    assert f"blk.{block}.nextn.enorm.weight" in names
    assert any(n.startswith(f"blk.{block}.attn_") for n in names)
    assert report["ok"]


@pytest.mark.parametrize("fixture", EXPORTED)
def test_every_mapped_tensor_is_bit_identical(run_cli, fixture: str) -> None:
    """``--all``: the whole file, with only what the converter re-lays out listed as not
    compared (gated-delta-net projections and their ``ssm_*`` counterparts)."""
    report = _diff(run_cli, FIXTURES / fixture, _gguf(f"{fixture}__bf16__full"), "--all")
    assert {t["status"] for t in report["tensors"]} == {"equal"}
    outside = [
        f for f in _tensor_check(report)["findings"] if f["subject"] == "outside the mapping"
    ]
    for finding in outside:
        assert finding["status"] == "skip"
        for name in finding["details"]["names"]:  # linear attention only, never the MTP block
            assert "linear_attn" in name or not name.startswith(f"blk.{NEXTN[fixture]}.")
            assert not name.startswith("mtp.")
    assert bool(outside) == fixture.startswith(("qwen3_next", "accept_qwen3_next", "qwen3_5"))


def test_the_experts_are_stacked_in_expert_order(run_cli) -> None:
    ckpt = open_checkpoint(FIXTURES / "glm4_moe")
    plan = plan_gguf(BY_ARCH["glm4moe"], ckpt.tensors, hidden=2)
    target = plan.targets["blk.2.ffn_gate_exps.weight"]
    assert target.sources == tuple(
        f"model.layers.2.mlp.experts.{e}.gate_proj.weight" for e in range(4)
    )
    stored = open_checkpoint(_gguf("glm4_moe__bf16__full")).tensors[target.name]
    assert stored.shape == (4, *ckpt.tensors[target.sources[0]].shape)


def test_q8_0_is_reported_quantized_and_dequantized_within_half_a_step(run_cli) -> None:
    """Q8_0 output: rows of 32 become Q8_0, shorter ones F16 (the converter's fallback); each
    is quantized, not equal, and ``--dequantize`` measures it against the BF16 source."""
    gguf = _gguf("glm4_moe__q8_0__full")
    plain = _diff(run_cli, FIXTURES / "glm4_moe", gguf)
    quantized = {t["name"]: t for t in plain["tensors"] if t["status"] == "quantized"}
    assert quantized["blk.2.nextn.eh_proj.weight"]["storage"] == ["BF16", "GGUF Q8_0"]
    assert quantized["blk.2.attn_q.weight"]["storage"] == ["BF16", "GGUF F16"]
    assert plain["ok"]
    measured = _diff(run_cli, FIXTURES / "glm4_moe", gguf, "--dequantize")
    steps = {t["name"]: t["steps"] for t in measured["tensors"] if t["status"] == "quantized"}
    assert steps.keys() == quantized.keys()
    assert 0 < steps["blk.2.nextn.eh_proj.weight"] <= 0.51  # the F16 scale's own rounding
    assert steps["blk.2.attn_q.weight"] == 0.0  # BF16 values fit F16 exactly here
    assert measured["ok"]


def test_a_flipped_quant_in_a_q8_0_block_is_many_steps_off(run_cli, tmp_path: Path) -> None:
    damaged = tmp_path / "glm.gguf"
    shutil.copy(_gguf("glm4_moe__q8_0__full"), damaged)
    meta = open_checkpoint(damaged).tensors["blk.2.nextn.eh_proj.weight"]
    flip_bit(damaged, meta.offset + 2 + 5, bit=6)  # block 0: 2 bytes of scale, then int8 q
    report = _diff(run_cli, FIXTURES / "glm4_moe", damaged, "--dequantize", code=1)
    (bad,) = [f for f in _tensor_check(report)["findings"] if f["status"] == "fail"]
    assert bad["subject"] == "blk.2.nextn.eh_proj.weight"
    assert bad["details"]["steps"] >= 63
    assert bad["message"].endswith("the stored values are not the source's")


def test_a_flipped_bit_in_a_bf16_gguf_is_found(run_cli, tmp_path: Path) -> None:
    damaged = tmp_path / "qwen.gguf"
    shutil.copy(_gguf("qwen3_next__bf16__full"), damaged)
    meta = open_checkpoint(damaged).tensors["blk.2.nextn.eh_proj.weight"]
    flip_bit(damaged, meta.offset + 10, bit=1)
    report = _diff(run_cli, FIXTURES / "qwen3_next", damaged, code=1)
    (bad,) = [t for t in report["tensors"] if t["status"] != "equal"]
    assert (bad["name"], bad["status"], bad["differing_elements"]) == (
        "blk.2.nextn.eh_proj.weight",
        "bits_differ",
        1,
    )


def test_deepseek_v3_lost_its_mtp_layer_in_conversion(run_cli) -> None:
    """This converter writes DeepSeek-V3 without the MTP layer: the diff fails on the count
    and names every MTP tensor missing, and says why."""
    report = _diff(run_cli, FIXTURES / "deepseek_v3", _gguf("deepseek_v3__bf16__full"), code=1)
    (config,) = [c for c in report["checks"] if c["name"] == CheckName.CONFIG]
    (count,) = [f for f in config["findings"] if f["status"] == "fail"]
    assert count["subject"] == "nextn_predict_layers"
    missing = {t["name"] for t in report["tensors"] if t["status"] == "missing"}
    assert "blk.2.nextn.eh_proj.weight" in missing and "blk.2.ffn_gate_exps.weight" in missing
    assert all(n.startswith("blk.2.") for n in missing)
    notes = {f["subject"]: f["message"] for f in _tensor_check(report)["findings"]}
    assert "not supported for DeepseekV3ForCausalLM" in notes["llama.cpp MTP export"]
    main = _diff(
        run_cli, FIXTURES / "deepseek_v3", _gguf("deepseek_v3__f32__full"), "--all", code=1
    )
    kept = {t["name"] for t in main["tensors"] if t["status"] == "equal"}
    assert "blk.1.ffn_gate_exps.weight" in kept and "blk.0.attn_kv_a_mqa.weight" in kept


def test_another_models_gguf_is_refused(run_cli) -> None:
    run = run_cli("diff", FIXTURES / "glm4_moe", _gguf("qwen3_next__bf16__full"))
    assert run.exit_code == 2
    assert "is a Glm4MoeForCausalLM checkpoint" in run.stderr
    assert "llama.cpp's qwen3next, converted from Qwen3NextForCausalLM" in run.stderr


@pytest.mark.parametrize("fixture", [*EXPORTED, "deepseek_v3"])
def test_the_names_are_gguf_pys_own(fixture: str) -> None:
    """Every name of the rules, for every tensor of the fixture, is the one gguf-py's
    ``TensorNameMap`` (what the converter calls) gives the HF name after the converter's own
    renames; the stacked experts map through their merged name."""
    require("gguf")
    import gguf

    ckpt = open_checkpoint(FIXTURES / fixture)
    arch = BY_ARCH[open_checkpoint(_gguf(f"{fixture}__f32__full")).config["architecture"]]
    hidden = ckpt.config["num_hidden_layers"]
    plan = plan_gguf(arch, ckpt.tensors, hidden)
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch.arch)
    names = gguf.get_tensor_name_map(model_arch, hidden + 1)
    suffixes = (".weight", ".bias")
    for target, rule in plan.targets.items():
        source = rule.sources[0]
        if arch.qwen_mtp and source.startswith("mtp."):
            continue  # renamed first; checked through the converted file below
        if not arch.exports_mtp and target.startswith(f"blk.{hidden}."):
            continue  # gguf-py gives deepseek2 no nextn tensors: there is nothing to match
        if len(rule.sources) > 1:  # experts: the converter maps the merged name
            source = source.replace(".experts.0.", ".experts.")
        # conversion/base.py map_tensor_name renames the router bias before the lookup
        source = source.replace("e_score_correction_bias", "e_score_correction.bias")
        assert names.get_name(source, try_suffixes=suffixes) == target, source
    written = set(open_checkpoint(_gguf(f"{fixture}__f32__full")).tensors)
    if arch.exports_mtp:
        assert set(plan.targets) <= written


def test_deepseek_v3_q8_0_main_layers_dequantize_within_their_steps(run_cli) -> None:
    gguf = _gguf("deepseek_v3__q8_0__full")
    report = _diff(run_cli, FIXTURES / "deepseek_v3", gguf, "--all", "--dequantize", code=1)
    quantized = [t for t in report["tensors"] if t["status"] == "quantized"]
    assert any(t["storage"] == ["BF16", "GGUF Q8_0"] for t in quantized)
    assert quantized and all(t["steps"] <= 0.55 for t in quantized)
    missing = {t["name"] for t in report["tensors"] if t["status"] == "missing"}
    assert missing and all(n.startswith("blk.2.") for n in missing)


def test_the_gguf_may_be_either_side(run_cli) -> None:
    gguf = _gguf("qwen3_5_text__q8_0__full")
    report = _diff(run_cli, gguf, FIXTURES / "qwen3_5_text", "--dequantize")
    quantized = [t for t in report["tensors"] if t["status"] == "quantized"]
    assert quantized and all(t["storage"][0] == "GGUF Q8_0" for t in quantized)
    assert all(0 < t["steps"] <= 0.55 for t in quantized)
    assert report["inputs"][1]["format"] == "hf-safetensors as gguf"


@pytest.mark.parametrize("code", ["Q8_0", "Q4_K", "Q6_K"])
def test_the_block_decoders_agree_with_gguf_py(code: str) -> None:
    """Random blocks (finite F16 scales) decode to gguf-py's own ``dequantize`` values."""
    require("gguf")
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    from mtpcheck.checks.gguf_pairs import _values
    from mtpcheck.dtypes import DTYPES

    size = DTYPES[code].block_bytes
    blocks = np.random.default_rng(1).integers(0, 256, size=(9, size), dtype=np.uint8)
    scales = {"Q8_0": (0, [0.01]), "Q4_K": (0, [0.01, 0.002]), "Q6_K": (size - 2, [0.01])}
    at, values = scales[code]
    blocks[:, at : at + 2 * len(values)] = np.frombuffer(np.array(values, "<f2").tobytes(), "u1")
    ours, step, low, high = _values(blocks.tobytes(), code)
    theirs = dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType[code]).reshape(-1)
    assert np.array_equal(ours.astype(np.float32), theirs)
    assert step.shape == ours.shape and (step > 0).any()
    assert ((low <= ours) & (ours <= high)).all() and (low < high).any()


KQUANT = Path(__file__).resolve().parent / "data" / "llamacpp_kquant"
WIDE = KQUANT / "glm4_moe_wide"
"""The GLM-4.5 fixture at width 256 (rows long enough for a K-quant block of 256)."""
Q4_K_M = KQUANT / "glm4_moe_wide__q4_k_m" / "Glm4_Moe_Wide-Q4_K_M.gguf"
"""``WIDE`` converted by llama.cpp's converter (BF16), then stored ``Q4_K_M`` by its
``llama-quantize`` (``tests/thirdparty/llamacpp/quantize.sh``)."""


def test_llama_quantize_k_quants_are_within_half_a_step_of_the_source(run_cli) -> None:
    """``Q4_K_M`` mixes Q4_K and Q6_K (and keeps norms and the router F32): each quantized
    tensor, the nextn layer's included, decodes to the source's values rounded to its grid,
    measured from the nearest end of its block's range where the source lies beyond it."""
    plain = _diff(run_cli, WIDE, Q4_K_M, "--all")
    storage = {t["name"]: t["storage"][1] for t in plain["tensors"] if t["status"] == "quantized"}
    assert storage["blk.2.nextn.eh_proj.weight"] == "GGUF Q4_K"
    assert storage["blk.2.ffn_down_exps.weight"] == "GGUF Q6_K"
    assert storage["output.weight"] == "GGUF Q6_K"
    assert set(storage.values()) == {"GGUF Q4_K", "GGUF Q6_K"}
    equal = {t["name"] for t in plain["tensors"] if t["status"] == "equal"}
    assert "blk.2.nextn.enorm.weight" in equal and "blk.2.ffn_gate_inp.weight" in equal
    assert plain["ok"]
    measured = _diff(run_cli, WIDE, Q4_K_M, "--all", "--dequantize")
    steps = {t["name"]: t["steps"] for t in measured["tensors"] if t["status"] == "quantized"}
    assert steps.keys() == storage.keys()
    assert all(0.4 < s <= 0.5 for s in steps.values()), steps
    assert measured["ok"]


def test_the_k_quant_file_passes_inspect_with_its_head_copy_quantized_apart(run_cli) -> None:
    """llama-quantize stores the nextn layer's head copy Q4_K where ``output`` is Q6_K: not
    comparable bit for bit, said as such; the embedding copy (both Q4_K) is bit-identical."""
    run = run_cli("inspect", Q4_K_M, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (copies,) = [c for c in report["checks"] if c["name"] == CheckName.SHARED_COPIES]
    found = {f["subject"]: (f["status"], f["message"]) for f in copies["findings"]}
    assert found["blk.2.nextn.embed_tokens.weight"][0] == "pass"
    status, message = found["blk.2.nextn.shared_head_head.weight"]
    assert status == "info" and "stored Q4_K, output.weight Q6_K" in message


@pytest.mark.parametrize(
    ("where", "bit", "at_least"),
    [
        (4 + 12 + 5, 3, 7.5),  # block 0's sixth quant byte: a nibble's top bit, 8 steps
        (4 + 1, 4, 1.5),  # block 0's second sub-block scale: its 6-bit sc from 1 to 17 or so
    ],
    ids=["quant", "scale"],
)
def test_a_flipped_bit_in_a_q4_k_block_is_steps_off(
    run_cli, tmp_path: Path, where: int, bit: int, at_least: float
) -> None:
    damaged = tmp_path / Q4_K_M.name
    shutil.copy(Q4_K_M, damaged)
    meta = open_checkpoint(damaged).tensors["blk.2.nextn.eh_proj.weight"]
    flip_bit(damaged, meta.offset + where, bit=bit)
    report = _diff(run_cli, WIDE, damaged, "--dequantize", code=1)
    (bad,) = [f for f in _tensor_check(report)["findings"] if f["status"] == "fail"]
    assert bad["subject"] == "blk.2.nextn.eh_proj.weight"
    assert bad["details"]["steps"] >= at_least
