"""``roundtrip CONFIG --synthetic`` on every published config of an MTP model this repository
keeps (src/mtpcheck/families/published, each with its source): the scaled-down config keeps one
main layer of every kind and every MTP layer, the tiny checkpoint is built whatever the
family's converter, and the round trip ends in PASS or in a one-line refusal that names what
converts the family instead, never in an internal error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.convert.synthetic import build_synthetic
from mtpcheck.convert.tiny_config import TINY_DIMS, scale_down
from mtpcheck.families import declared_count, detect_family
from mtpcheck.families.layout import flat_patterns
from mtpcheck.families.main_layout import main_layout
from mtpcheck.families.published import PUBLISHED_DIR
from mtpcheck.mapping.plan import MappingError, mappable_family
from tests.conftest import FIXTURES, PEAK

CONFIGS = PUBLISHED_DIR
PUBLISHED = sorted(p.stem for p in CONFIGS.glob("*.json"))

NO_MAPPING = "roundtrip cannot judge the Megatron checkpoint between its stages"
OUTCOMES: dict[str, tuple[str, ...]] = {
    "deepseek_v3__DeepSeek-V3": ("pass",),
    "deepseek_v3__DeepSeek-V3.1-NVFP4": ("pass",),
    "deepseek_v32__DeepSeek-V3.2": (
        "cannot write DeepSeek-V3.2: megatron-core's MTP layer draws through the main output",
        "Megatron-Bridge 0.6.2 has no DeepSeek-V3.2 bridge",
    ),
    "deepseek_v4__DeepSeek-V4-Flash": (
        "no HF <-> Megatron mapping for DeepSeek-V4 yet",
        NO_MAPPING,
        "Megatron-Bridge 0.6.2's DeepSeekV4Bridge converts it (the MTP layers included)",
    ),
    "deepseek_v4__DeepSeek-V4-Pro": ("no HF <-> Megatron mapping for DeepSeek-V4 yet",),
    "glm4_moe__GLM-4.5-Air": ("pass",),
    "glm4_moe__GLM-4.7": ("pass",),
    "glm_moe_dsa__GLM-5": ("pass",),
    "glm_moe_dsa__GLM-5.2": ("pass",),
    "kimi_k2__Kimi-K2-Instruct": ("pass",),
    "kimi_k25__Kimi-K2.5-NVFP4": ("model_type 'kimi_k25' as an MTP family",),
    "minimax_m2__MiniMax-M2.5-NVFP4": (
        "no HF <-> Megatron mapping for MiniMax-M2 yet",
        "Megatron-Bridge 0.6.2's MiniMaxM2Bridge converts it (but not the MTP layers)",
    ),
    "minimax_m2__MiniMax-M2.7": ("no HF <-> Megatron mapping for MiniMax-M2 yet",),
    "nemotron_h__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("cannot write Nemotron-H",),
    "nemotron_h__NVIDIA-Nemotron-3-Super-120B-A12B-FP8": (
        "cannot write Nemotron-H / Nemotron 3: megatron-core holds it as its hybrid (Mamba)",
        "Megatron-Bridge 0.6.2's NemotronHBridge converts it (the MTP layers included): give "
        "converters as --to-megatron CMD and --to-hf CMD",
    ),
    "nemotron_h__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": ("cannot write Nemotron-H",),
    "nemotron_h__NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": ("cannot write Nemotron-H",),
    "qwen3_5__Qwen3.5-27B": (
        "cannot write Qwen3.5 / 3.6 (VLM): it writes the language model of Qwen3.5",
        "Megatron-Bridge 0.6.2's Qwen35VLBridge / Qwen35VLMoEBridge converts it",
    ),
    "qwen3_5__Qwen3.5-9B": ("cannot write Qwen3.5 / 3.6 (VLM)",),
    "qwen3_5_moe__Qwen3.5-122B-A10B": ("cannot write Qwen3.5 / 3.6 (VLM)",),
    "qwen3_5_moe__Qwen3.5-35B-A3B": ("cannot write Qwen3.5 / 3.6 (VLM)",),
    "qwen3_5_moe__Qwen3.6-35B-A3B": ("cannot write Qwen3.5 / 3.6 (VLM)",),
    "qwen3_next__Qwen3-Next-80B-A3B-Thinking": ("pass",),
    "step3p5__Step-3.5-Flash": (
        "no HF <-> Megatron mapping for Step-3.5-Flash yet",
        "Megatron-Bridge 0.6.2's Step35Bridge converts it (the MTP layers included)",
    ),
}
"""What ``roundtrip CONFIG --synthetic`` ends in, per published config: PASS, or exit 2 with
one line holding each of these parts."""


def _documented() -> dict[str, tuple[str, str]]:
    """docs/commands/roundtrip.md's table of the published configs: config -> (outcome,
    converter named), as scripts/synthetic_table.py measured them."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "commands" / "roundtrip.md").read_text()
    table = page.split("<!-- synthetic-table -->", 1)[1].split("<!-- /synthetic-table -->", 1)[0]
    rows = [line.split(" | ") for line in table.strip().splitlines()[2:]]
    return {row[0].strip("| `"): (row[1], row[2]) for row in rows}


DOCUMENTED = _documented()


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())  # type: ignore[no-any-return]


def _kinds_and_mtp(config: dict[str, Any]) -> tuple[set[Any], int, list[Any]]:
    family = detect_family(config)
    assert family is not None
    mtp = declared_count(config, family, None).value or 0
    layout = main_layout(family, config, mtp=mtp)
    return set(layout.kinds), mtp, flat_patterns(family, config)[0]


def test_every_published_config_has_an_outcome_here_and_in_the_docs() -> None:
    assert set(OUTCOMES) == set(DOCUMENTED) == set(PUBLISHED)


@pytest.mark.parametrize("name", [n for n in PUBLISHED if detect_family(_config(n))])
def test_scaled_down_config_keeps_every_kind_of_layer_and_every_mtp_layer(name: str) -> None:
    real = _config(name)
    family = detect_family(real)
    assert family is not None
    tiny = scale_down(real, family, name)
    real_kinds, real_mtp, real_pattern = _kinds_and_mtp(real)
    tiny_kinds, tiny_mtp, tiny_pattern = _kinds_and_mtp(tiny.config)
    assert tiny_kinds == real_kinds  # one layer of each kind, no other
    assert len(tiny.kept_layers) == len(real_kinds)
    assert (tiny_mtp, tiny_pattern) == (real_mtp, real_pattern)
    widths = _ints(tiny.config)
    scaled = TINY_DIMS.keys() & widths.keys() - {"num_key_value_heads"}
    assert all(widths[key] <= TINY_DIMS[key] for key in scaled)
    # where a config states no key-value heads, as many as the attention heads
    assert widths.get("num_key_value_heads", 0) <= TINY_DIMS["num_attention_heads"]
    assert max(_token_ids(tiny.config), default=0) < TINY_DIMS["vocab_size"]


def _ints(node: Any, out: dict[str, int] | None = None) -> dict[str, int]:
    """The largest integer under each key, at any nesting level but a vision tower's."""
    out = {} if out is None else out
    for key, value in node.items():
        if isinstance(value, dict) and key != "vision_config":
            _ints(value, out)
        elif isinstance(value, int) and not isinstance(value, bool):
            out[key] = max(out.get(key, value), value)
    return out


def _token_ids(node: Any) -> list[int]:
    found: list[int] = []
    for key, value in node.items():
        if isinstance(value, dict):
            found += _token_ids(value)
        elif key.endswith(("token_id", "token_ids", "token_index")):
            found += [v for v in (value if isinstance(value, list) else [value]) if v is not None]
    return found


def _scaled(name: str) -> dict[str, Any]:
    real = _config(name)
    family = detect_family(real)
    assert family is not None
    return scale_down(real, family, name).config


def test_token_ids_past_the_vocabulary_stay_distinct() -> None:
    """GLM-5's pad id is one of its three eos ids, and stays so; Qwen3.5's image, video and
    vision-start ids stay three ids."""
    glm = _scaled("glm_moe_dsa__GLM-5")
    assert glm["pad_token_id"] == glm["eos_token_id"][0]
    assert len(set(glm["eos_token_id"])) == 3
    qwen = _scaled("qwen3_5__Qwen3.5-27B")
    ids = [qwen[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id")]
    assert len(set(ids)) == 3 and max(ids) < qwen["text_config"]["vocab_size"]


def test_a_vision_tower_shrinks_to_one_block_of_the_language_models_width() -> None:
    vision = _scaled("qwen3_5__Qwen3.5-27B")["vision_config"]
    assert (vision["depth"], vision["hidden_size"], vision["num_heads"]) == (1, 16, 2)
    assert vision["out_hidden_size"] == TINY_DIMS["hidden_size"]


def test_layers_numbered_by_scalar_keys_are_renumbered_for_the_layers_kept() -> None:
    """Step-3.5 names its MoE layers (3..44 of 45, the MTP layers 45..47 dense); DeepSeek-V3
    its dense first layers (3); DeepSeek-V4 its hash-routed first layers (3)."""
    step = _scaled("step3p5__Step-3.5-Flash")
    assert step["num_hidden_layers"] == 6  # real layers 0, 1, 3, 4, 43, 44
    assert step["moe_layers_enum"] == "2,3,4,5"
    assert len(step["layer_types"]) == 6 + 3  # the MTP layers' entries kept
    deepseek = _scaled("deepseek_v3__DeepSeek-V3")
    assert (deepseek["num_hidden_layers"], deepseek["first_k_dense_replace"]) == (2, 1)
    v4 = _scaled("deepseek_v4__DeepSeek-V4-Flash")
    assert (v4["num_hidden_layers"], v4["num_hash_layers"]) == (4, 2)
    assert v4["compress_ratios"][-1] == 0  # the MTP layer's


def test_a_quantization_block_is_left_out_and_said() -> None:
    real = _config("deepseek_v3__DeepSeek-V3")
    family = detect_family(real)
    assert family is not None
    tiny = scale_down(real, family, "x")
    assert "quantization_config" not in tiny.config
    assert tiny.notes == (
        "quantization_config (fp8) left out: the synthetic checkpoint is stored unquantized, "
        "in the config's dtype",
    )


def _has_mapping(name: str) -> bool:
    try:
        mappable_family(_config(name))
    except MappingError:
        return False
    return True


@pytest.mark.parametrize(
    "name", [n for n in PUBLISHED if OUTCOMES[n] != ("pass",) and _has_mapping(n)]
)
def test_tiny_checkpoint_is_built_where_only_the_converter_is_missing(
    name: str, run_cli, tmp_path: Path
) -> None:
    """Families whose built-in converter is missing still get their tiny checkpoint (for a
    round trip through converters of one's own): it passes ``inspect``, its MTP layers whole."""
    built = build_synthetic(CONFIGS / f"{name}.json", tmp_path / "tiny")
    run = run_cli("inspect", built, "--format", "json")
    assert run.exit_code == 0, run
    (summary,) = json.loads(run.stdout)["inputs"]
    real = _config(name)
    family = detect_family(real)
    assert family is not None
    assert summary["declared_mtp_layers"] == declared_count(real, family, None).value
    layers = summary["mtp_layers"]
    assert [layer["complete"] for layer in layers] == [True] * (summary["declared_mtp_layers"] or 0)


@pytest.mark.parametrize("name", PUBLISHED)
def test_synthetic_round_trip_passes_or_refuses_in_one_line(
    name: str, run_cli, tmp_path: Path
) -> None:
    path = CONFIGS / f"{name}.json"
    run = run_cli(
        "roundtrip", path, "--synthetic", "--workdir", tmp_path, "--format", "json", "--quiet"
    )
    outcome, named = DOCUMENTED[name]
    if OUTCOMES[name] == ("pass",):
        assert outcome == "PASS"
        assert run.exit_code == 0, run
        report = json.loads(run.stdout)
        assert report["ok"] is True
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert statuses[CheckName.STAGE1_TENSORS] == statuses[CheckName.ROUNDTRIP_TENSORS] == "pass"
    else:
        assert run.exit_code == 2, run
        (line,) = run.stderr.splitlines()
        assert line.startswith(f"mtpcheck: error: {path}: ")
        for part in OUTCOMES[name]:
            assert part in line
        assert outcome.startswith("refused: ") and outcome.removeprefix("refused: ") in line
        assert named == "-" or named in line
    assert not any(tmp_path.iterdir())  # nothing left behind


def test_a_key_the_scaling_needs_is_named_in_one_line(run_cli, tmp_path: Path) -> None:
    config = _config("glm_moe_dsa__GLM-5")
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = run_cli("roundtrip", path, "--synthetic", "--workdir", tmp_path / "w", "--quiet")
    assert (run.exit_code, run.stderr) == (
        2,
        f"mtpcheck: error: {path}: the config lacks num_hidden_layers, which a scaled-down "
        "model (how many layers to cut) needs\n",
    )
    assert not any((tmp_path / "w").iterdir())


def test_a_key_the_converter_needs_is_named_in_one_line(run_cli, tmp_path: Path) -> None:
    """A real checkpoint whose config lost a width megatron-core's model needs: exit 2 and
    the key, before anything is converted (not an internal error, and no FAIL on the
    checkpoint, whose tensors are whole)."""
    source = tmp_path / "glm4_moe"
    shutil.copytree(FIXTURES / "glm4_moe", source)
    config = json.loads((source / "config.json").read_text())
    del config["moe_intermediate_size"]
    (source / "config.json").write_text(json.dumps(config))
    run = run_cli("roundtrip", source, "--workdir", tmp_path / "w", "--quiet")
    assert (run.exit_code, run.stderr) == (
        2,
        f"mtpcheck: error: {source}/config.json: the config lacks moe_intermediate_size, "
        "which megatron-core's model of it needs\n",
    )
    assert not any((tmp_path / "w").iterdir())


@pytest.mark.parametrize(
    "name", ["qwen3_5__Qwen3.5-27B", "nemotron_h__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"]
)
def test_the_build_stays_small_whatever_the_real_size(name: str, tmp_path: Path) -> None:
    """Qwen3.5-27B's nested text config once went unscaled (11 GB before the kernel stopped
    it); the largest published model, Nemotron-3 Ultra 550B, built as well: the builder's own
    process peaks under 2 GiB."""
    code = PEAK + (
        "import sys\nfrom pathlib import Path\n"
        "from mtpcheck.convert.synthetic import build_synthetic\n"
        "build_synthetic(Path(sys.argv[1]), Path(sys.argv[2]))\nprint(peak_kib())\n"
    )
    argv = [sys.executable, "-c", code, str(CONFIGS / f"{name}.json"), str(tmp_path / "tiny")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 2 * 1024 * 1024  # KiB


def test_a_key_the_mapping_needs_is_named_in_one_line(run_cli, tmp_path: Path) -> None:
    """Qwen3-Next without its gated delta net's head count: the mapping cannot split the
    fused projection; the config is named, exit 2 (it was a FAIL of the checkpoint)."""
    source = tmp_path / "qwen3_next"
    shutil.copytree(FIXTURES / "qwen3_next", source)
    config = json.loads((source / "config.json").read_text())
    del config["linear_num_value_heads"]
    (source / "config.json").write_text(json.dumps(config))
    for command in (("roundtrip", source, "--workdir", tmp_path / "w"), ("inspect", source)):
        run = run_cli(*command, "--quiet")
        if command[0] == "inspect":  # inspect does not map to Megatron: no need of the key
            assert run.exit_code == 0, run
            continue
        assert (run.exit_code, run.stderr) == (
            2,
            f"mtpcheck: error: {source}/config.json: the config lacks the linear_* gated "
            "delta net sizes, which the HF <-> Megatron mapping of "
            "model.layers.0.linear_attn.in_proj_qkvz.weight needs\n",
        )
