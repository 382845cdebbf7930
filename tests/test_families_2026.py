"""The MTP families of 2025-2026: complete fixtures pass; realistic damage fails, exactly.

The fixtures come from ``fixtures/make_families_2026.py`` (main model from the real
transformers class). Damage is built for real: transformers' own ``from_pretrained`` +
``save_pretrained`` (every one of these classes drops the MTP tensors and keeps the config
key), a layer of several deleted, a packed expert tensor deleted.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.families import FAMILIES, MtpFamily
from mtpcheck.families.catalog_formats import FORMATS
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, flip_bit


def _fixture_of(family: MtpFamily) -> str | None:
    """The shipped fixture of a registered family: the folder named by its key or, failing
    that, by one of its model types (None: the family ships no fixture)."""
    return next((n for n in (family.key, *family.model_types) if (FIXTURES / n).is_dir()), None)


BEFORE_2025 = frozenset(
    {
        "deepseek_v3",
        "deepseek_v32",
        "kimi_k2",
        "glm4_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "step3p5",
        "qwen3_next",
        "mimo",
        "ernie4_5_moe",
        "longcat_flash",
    }
)
"""Families registered before 2025 (their fixtures, where they have one, are
``fixtures/make_fixtures.py``'s); the registry is split by layout style, not by year."""
REGISTERED_2026 = tuple(f for f in FAMILIES if f.key not in BEFORE_2025 and f not in FORMATS)
"""The families of 2025-2026, in registry order."""
FAMILIES_2026 = tuple(name for f in REGISTERED_2026 if (name := _fixture_of(f)) is not None)
"""The fixtures of the 2025-2026 families, in registry order."""

WITHOUT_FIXTURE = {"qwen4_exp", "gemma4"}
"""2025-2026 families with no fixture of their own: Qwen3.8's full model (its text-only
sibling ``qwen4_exp_text`` has one) and Gemma 4's main model (its drafter ships apart, as
``gemma4_assistant``). Any other family without one fails the test below."""


def test_only_the_named_families_ship_no_fixture() -> None:
    assert {f.key for f in REGISTERED_2026 if _fixture_of(f) is None} == WITHOUT_FIXTURE


# fixture -> (registry key, MTP layers, where the count is declared)
EXPECTED: dict[str, tuple[str, int, str]] = {
    "qwen3_5_moe": ("qwen3_5", 1, "text_config.mtp_num_hidden_layers"),
    "qwen3_5_text": ("qwen3_5_text", 1, "mtp_num_hidden_layers"),
    "exaone_moe": ("exaone_moe", 1, "num_nextn_predict_layers"),
    "exaone4_5": ("exaone4_5", 1, "num_nextn_predict_layers"),
    "qwen4_exp_text": ("qwen4_exp_text", 1, "mtp_num_hidden_layers"),
    "deepseek_v4": ("deepseek_v4", 1, "num_nextn_predict_layers"),
    "kimi_k3": ("kimi_k3", 1, "text_config.num_nextn_predict_layers"),
    "glm5_next": ("glm5_next", 1, "text_config.num_nextn_predict_layers"),
    "pangu_ultra_moe": ("pangu_ultra_moe", 1, "num_nextn_predict_layers"),
    "hy_v3": ("hy_v3", 1, "num_nextn_predict_layers"),
    "hy_v4": ("hy_v4", 1, "num_nextn_predict_layers"),
    "bailing_hybrid": ("bailing", 1, "num_nextn_predict_layers"),
    "sarvam_moe": ("sarvam_moe", 1, "num_nextn_predict_layers"),
    "step3p7": ("step3p7", 3, "text_config.num_nextn_predict_layers"),
    "mimo_v2_flash": ("mimo_v2_flash", 3, "no count key; MiMo-V2-Flash loaders assume 3"),
    "minimax_m3": ("minimax_m3", 1, "text_config.num_mtp_modules"),
    "nemotron_h": ("nemotron_h", 1, "num_nextn_predict_layers"),
}
NO_CLASS = {"kimi_k3", "pangu_ultra_moe"}
"""Fixtures relabelled from DeepSeek-V3: transformers has no class of their own."""


def _inspect(run_cli, path: Path) -> tuple[int, dict[str, Any]]:
    run = run_cli("inspect", path, "--format", "json")
    return run.exit_code, json.loads(run.stdout)


def _findings(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    found = next(c for c in report["checks"] if c["name"] == check)
    return [(f["status"], f["message"]) for f in found["findings"]]


def _config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text())


def _rewrite(src: Path, dst: Path, keep: Any) -> None:
    """A copy of ``src`` without the tensors ``keep(name)`` rejects, as a tool that drops
    them writes it (safetensors' own writer)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    save_file(
        {n: t for n, t in tensors.items() if keep(n)},
        dst / "model.safetensors",
        metadata={"format": "pt"},
    )


def test_every_2026_fixture_is_registered_and_listed() -> None:
    import runpy

    script = runpy.run_path(str(FIXTURES / "make_families_2026.py"))
    assert sorted(script["FAMILIES_2026"]) == sorted(FAMILIES_2026)  # built in an order of its own
    for name in FAMILIES_2026:
        assert (FIXTURES / name / "model.safetensors").is_file(), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_complete_checkpoint_passes(run_cli, name: str) -> None:
    key, layers, source = EXPECTED[name]
    code, report = _inspect(run_cli, FIXTURES / name)
    if name == "minimax_m2":
        return  # advertises MTP it does not ship: its own test below
    assert code == 0, report
    assert report["inputs"][0]["family"] == key
    said = "assumed" if source.startswith("no count key") else "declared"
    assert _findings(report, CheckName.MTP_COUNT) == [
        ("pass", f"{layers} {said} ({source}); {layers} present, complete")
    ]
    statuses = [s for s, _ in _findings(report, CheckName.MTP_LAYERS)]
    assert statuses == ["pass"] * layers


def test_a_config_that_advertises_mtp_without_weights_fails_naming_the_key(run_cli) -> None:
    code, report = _inspect(run_cli, FIXTURES / "minimax_m2")
    assert code == 1
    assert _findings(report, CheckName.MTP_COUNT) == [
        (
            "fail",
            "config declares 3 MTP layer(s) (num_mtp_modules) but the checkpoint holds no "
            "MTP weights",
        )
    ]


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - NO_CLASS - {"minimax_m2"}))
def test_transformers_loads_the_fixture_and_its_resave_drops_mtp(
    run_cli, tmp_path: Path, name: str
) -> None:
    """The real class reads every main tensor (none missing; the MTP tensors are dropped or
    unexpected, nothing else), and its save_pretrained loses MTP while the config keeps the
    count: mtpcheck names the key."""
    import transformers

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    src = FIXTURES / name
    cls = getattr(transformers, _config(src)["architectures"][0])
    model, info = cls.from_pretrained(src, output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    # unexpected keys are reported in transformers' in-memory names: judge by layer prefix
    prefixes = tuple(layer.prefix for layer in _analysis(src).layers)
    assert all(k.startswith(prefixes) for k in info["unexpected_keys"]), info["unexpected_keys"]
    model.save_pretrained(tmp_path / "resaved")
    _, layers, source = EXPECTED[name]
    code, report = _inspect(run_cli, tmp_path / "resaved")
    assert code == 1
    assert _findings(report, CheckName.MTP_COUNT) == [
        (
            "fail",
            f"config declares {layers} MTP layer(s) ({source}) but the checkpoint holds no "
            "MTP weights",
        )
    ]


def _analysis(path: Path) -> Any:
    from mtpcheck.families import analyse

    ckpt = open_checkpoint(path)
    return analyse(ckpt.config, ckpt.tensors, ckpt.config_path)


@pytest.mark.parametrize(
    ("name", "gone", "message"),
    [
        ("step3p7", "model.layers.3.", "config declares 3 (text_config.num_nextn_predict_layers)"),
        ("mimo_v2_flash", "model.mtp.layers.1.", "config declares 3 (no count key;"),
    ],
)
def test_one_layer_of_several_missing(
    run_cli, tmp_path: Path, name: str, gone: str, message: str
) -> None:
    _rewrite(FIXTURES / name, tmp_path / name, lambda n: not n.startswith(gone))
    code, report = _inspect(run_cli, tmp_path / name)
    assert code == 1
    [(status, text)] = _findings(report, CheckName.MTP_COUNT)
    assert status == "fail" and text.startswith(message)
    assert text.endswith("; 2 present, 2 complete")
    layers = _findings(report, CheckName.MTP_LAYERS)
    assert [s for s, _ in layers] == ["pass", "fail", "pass"]
    held = sum(n.startswith(gone) for n in open_checkpoint(FIXTURES / name).tensors)
    assert layers[1][1].startswith(f"{gone}: {held} of {held} tensors missing: ")


def test_transformers_mtp_loader_agrees_a_step3p7_layer_is_gone(tmp_path: Path) -> None:
    """transformers' own MtpModel (generate(use_mtp=True)) loads the fixture's three layers,
    and refuses the copy that lost one."""
    import transformers
    from transformers.modeling_layers import MtpModel

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    cls = transformers.Step3p7ForConditionalGeneration
    mtp = MtpModel.from_pretrained(cls.from_pretrained(FIXTURES / "step3p7"))
    depths = {k.split(".")[1] for k in mtp.state_dict() if k.startswith("layers.")}
    assert depths == {"0", "1", "2"}
    _rewrite(
        FIXTURES / "step3p7",
        tmp_path / "s",
        lambda n: n != "model.layers.3.shared_head.norm.weight",
    )
    with pytest.raises(Exception, match=r"layers\.1\.post_norm\.weight"):
        MtpModel.from_pretrained(cls.from_pretrained(tmp_path / "s"))


def test_a_missing_packed_expert_tensor_is_named(run_cli, tmp_path: Path) -> None:
    """Qwen3.6-style: the MTP block packs its routed experts, the main layers do not."""
    gone = "mtp.layers.0.mlp.experts.down_proj"
    assert gone in open_checkpoint(FIXTURES / "qwen3_5_moe").tensors
    _rewrite(FIXTURES / "qwen3_5_moe", tmp_path / "q", lambda n: n != gone)
    code, report = _inspect(run_cli, tmp_path / "q")
    assert code == 1
    assert _findings(report, CheckName.MTP_LAYERS) == [
        ("fail", f"mtp.layers.0.: 1 of 19 tensors missing: {gone}")
    ]


def test_packed_main_experts_and_per_expert_mtp_experts(run_cli, tmp_path: Path) -> None:
    """The other way round (main packed, MTP one tensor per expert): complete passes, a
    missing expert is named."""
    import torch
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "qwen3_5_moe", src)
    tensors = load_file(src / "model.safetensors")
    for layer in range(4):
        prefix = f"model.language_model.layers.{layer}.mlp.experts."
        per = sorted(n for n in tensors if n.startswith(prefix))
        if not per:
            continue
        experts = sorted({int(n[len(prefix) :].split(".")[0]) for n in per})
        tensors[prefix + "gate_up_proj"] = torch.stack(
            [
                torch.cat([tensors.pop(f"{prefix}{e}.{p}_proj.weight") for p in ("gate", "up")])
                for e in experts
            ]
        )
        tensors[prefix + "down_proj"] = torch.stack(
            [tensors.pop(f"{prefix}{e}.down_proj.weight") for e in experts]
        )
    mtp = "mtp.layers.0.mlp.experts."
    gate_up, down = tensors.pop(mtp + "gate_up_proj"), tensors.pop(mtp + "down_proj")
    for e in range(gate_up.shape[0]):
        gate, up = gate_up[e].chunk(2)
        tensors[f"{mtp}{e}.gate_proj.weight"] = gate.clone()
        tensors[f"{mtp}{e}.up_proj.weight"] = up.clone()
        tensors[f"{mtp}{e}.down_proj.weight"] = down[e].clone()
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, report = _inspect(run_cli, src)
    assert code == 0, _findings(report, CheckName.MTP_LAYERS)
    _rewrite(src, tmp_path / "gone", lambda n: n != f"{mtp}2.down_proj.weight")
    code, report = _inspect(run_cli, tmp_path / "gone")
    assert code == 1
    assert _findings(report, CheckName.MTP_LAYERS) == [
        ("fail", f"mtp.layers.0.: 1 of 29 tensors missing: {mtp}2.down_proj.weight")
    ]


def test_nemotron_h_depth_spans_its_pattern_and_a_lost_flat_layer_is_named(
    run_cli, tmp_path: Path
) -> None:
    ckpt = open_checkpoint(FIXTURES / "nemotron_h")
    assert _config(FIXTURES / "nemotron_h")["mtp_layers_block_type"] == ["full_attention", "moe"]
    [layer] = _analysis(FIXTURES / "nemotron_h").layers
    assert {n.split(".")[2] for n in layer.present} == {"0", "1"}  # one depth, two flat layers
    assert "mtp.layers.1.final_layernorm.weight" in ckpt.tensors
    _rewrite(FIXTURES / "nemotron_h", tmp_path / "n", lambda n: not n.startswith("mtp.layers.1."))
    code, report = _inspect(run_cli, tmp_path / "n")
    assert code == 1
    [(status, text)] = _findings(report, CheckName.MTP_LAYERS)
    assert status == "fail" and text.startswith("mtp.layers.0.: ")
    assert "mtp.layers.1.final_layernorm.weight" in layer.present
    missing = next(c for c in report["checks"] if c["name"] == CheckName.MTP_LAYERS)["findings"][0]
    assert "mtp.layers.1.final_layernorm.weight" in missing["details"]["missing"]
    assert "mtp.layers.1.mixer.gate.weight" in missing["details"]["missing"]


def test_deepseek_v4_copies_are_checked_bit_for_bit(run_cli, tmp_path: Path) -> None:
    """The Base release's embedding and head copies inside mtp.0 must equal the main ones."""
    dst = tmp_path / "v4"
    shutil.copytree(FIXTURES / "deepseek_v4", dst)
    meta = open_checkpoint(dst).tensors["mtp.0.head.weight"]
    flip_bit(dst / "model.safetensors", meta.offset + 3, bit=7)
    code, report = _inspect(run_cli, dst)
    assert code == 1
    [(emb, same), (head, diverged)] = _findings(report, CheckName.SHARED_COPIES)
    assert (emb, same) == ("pass", "bit-identical to embed.weight (4096 bytes)")
    assert head == "fail" and diverged.startswith("diverged from head.weight: ")


def test_ling_mtp_counted_inside_num_hidden_layers_is_found(run_cli, tmp_path: Path) -> None:
    """Ling-V2's remote code counts the MTP layer in num_hidden_layers: the layer holding
    eh_proj is the MTP layer, not a main layer with stray tensors."""
    dst = tmp_path / "ling"
    shutil.copytree(FIXTURES / "bailing_hybrid", dst)
    config = _config(dst)
    config["num_hidden_layers"] += 1
    (dst / "config.json").write_text(json.dumps(config))
    code, report = _inspect(run_cli, dst)
    assert code == 0, report
    assert _findings(report, CheckName.MTP_COUNT) == [
        ("pass", "1 declared (num_nextn_predict_layers); 1 present, complete")
    ]


def test_gemma4_main_model_has_its_drafter_elsewhere(run_cli, tmp_path: Path) -> None:
    import transformers

    config = transformers.Gemma4TextConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=8,
    )
    transformers.Gemma4ForCausalLM(config).save_pretrained(tmp_path / "g")
    code, report = _inspect(run_cli, tmp_path / "g")
    assert code == 0
    assert report["inputs"][0]["family"] == "gemma4"
    assert _findings(report, CheckName.MTP_COUNT) == [
        ("pass", "no MTP layers expected: the drafter ships as a separate checkpoint")
    ]
    code, report = _inspect(run_cli, FIXTURES / "gemma4_assistant")
    assert code == 0
    assert _findings(report, CheckName.MTP_COUNT) == [
        ("pass", "no MTP layers expected: this checkpoint is itself the drafter")
    ]


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("deepseek_v4", "mtp.0.h_proj.weight"),
        ("nemotron_h", "mtp.layers.1.final_layernorm.weight"),
        ("qwen3_5_moe", "mtp.layers.0.mlp.experts.gate_up_proj"),
        (
            "minimax_m3",
            "language_model.model.mtp.layers.0.transformer_layer.self_attn.index_q_proj.weight",
        ),
    ],
)
def test_diff_scopes_the_mtp_layers_of_new_families(
    run_cli, tmp_path: Path, name: str, tensor: str
) -> None:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    flip_bit(dst / "model.safetensors", open_checkpoint(dst).tensors[tensor].offset + 1, bit=0)
    run = run_cli("diff", FIXTURES / name, dst, "--format", "json")
    assert run.exit_code == 1, run
    report = json.loads(run.stdout)
    differing = [t["name"] for t in report["tensors"] if t["status"] != "equal"]
    assert differing == [tensor]
    scoped = {t["name"] for t in report["tensors"]}
    ckpt = open_checkpoint(FIXTURES / name)
    assert scoped == set(_analysis(FIXTURES / name).scope(ckpt.tensors))  # MTP + embed/head
    assert tensor in scoped


@pytest.mark.parametrize("name", sorted(NO_CLASS))
def test_mtp_dropped_by_a_tool_without_a_transformers_class(
    run_cli, tmp_path: Path, name: str
) -> None:
    """No transformers class to re-save with: the MTP layer is dropped the way a quantiser's
    name filter drops it (every tensor under its prefix), the config left as it was."""
    [layer] = _analysis(FIXTURES / name).layers
    _rewrite(FIXTURES / name, tmp_path / name, lambda n: not n.startswith(layer.prefix))
    code, report = _inspect(run_cli, tmp_path / name)
    _, layers, source = EXPECTED[name]
    assert code == 1
    assert _findings(report, CheckName.MTP_COUNT) == [
        (
            "fail",
            f"config declares {layers} MTP layer(s) ({source}) but the checkpoint holds no "
            "MTP weights",
        )
    ]
