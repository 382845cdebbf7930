"""Every drafter kind of the registry is recognised from what its writers put in config.json
and the tensor names (shared/reference: the drafter formats' own code), and a model is not
taken for a drafter."""

from __future__ import annotations

from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.families.drafter_kinds import DRAFTER_KIND_BY_KEY, DRAFTER_KINDS
from mtpcheck.families.drafters import dspark_inside, read_config, recognise, unknown_drafter

EAGLE3_NATIVE = {"midlayer.self_attn.q_proj.weight", "fc.weight", "d2t", "t2d", "norm.weight"}
DFLASH = {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.mlp.up_proj.weight"}

#: (config, tensor names, kind key)
SEEN: list[tuple[dict[str, Any], set[str], str]] = [
    ({"speculators_model_type": "eagle3"}, {"fc.weight"}, "eagle3-speculators"),
    ({"speculators_model_type": "peagle"}, {"fc.weight"}, "peagle"),
    ({"speculators_model_type": "dflash"}, {"fc.weight"}, "dflash-speculators"),
    ({"speculators_model_type": "mtp"}, {"mtp_layers.0.input_proj.weight"}, "mtp-speculators"),
    # SpecForge's export and NVIDIA ModelOpt name the class; SafeAILab saves a plain Llama
    ({"architectures": ["LlamaForCausalLMEagle3"]}, EAGLE3_NATIVE, "eagle3"),
    ({"architectures": ["LlamaForCausalLM"]}, EAGLE3_NATIVE, "eagle3"),
    ({"architectures": ["DFlashDraftModel"]}, DFLASH, "dflash"),
    (
        {"architectures": ["DFlashDraftModel"], "dflash_config": {"projector_type": "dspark"}},
        DFLASH | {"markov_head.markov_w1.weight"},
        "dspark",
    ),
    ({"architectures": ["Qwen3DSparkModel"]}, DFLASH, "dspark"),
    (
        {"architectures": ["DeepseekV3ForCausalLMNextN"]},
        {"model.layers.0.enorm.weight"},
        "nextn-export",
    ),
    ({"model_type": "minimax_m3_mtp"}, {"mtp.layers.0.eh_proj.weight"}, "mtp-head"),
    ({"model_type": "glm_moe_dsa_mtp"}, {"mtp.layers.0.eh_proj.weight"}, "mtp-head"),
    ({"model_type": "gemma4_assistant"}, {"pre_projection.weight"}, "gemma4-assistant"),
    (
        {"architectures": ["LlamaForCausalLM"]},
        {"fc.weight", "layers.0.mlp.up_proj.weight"},
        "eagle",
    ),
    ({"model_type": "medusa"}, set(), "medusa"),
    ({"model_type": "mlp_speculator"}, set(), "mlp-speculator"),
]


@pytest.mark.parametrize(
    ("config", "names", "key"), SEEN, ids=[s[2] + str(i) for i, s in enumerate(SEEN)]
)
def test_each_kind_is_recognised(config: dict[str, Any], names: set[str], key: str) -> None:
    kind = recognise(config, names)
    assert kind is not None and kind.key == key


def test_every_kind_is_recognised_by_some_case() -> None:
    assert {key for _, _, key in SEEN} == set(DRAFTER_KIND_BY_KEY)
    assert len(DRAFTER_KIND_BY_KEY) == len(DRAFTER_KINDS)


@pytest.mark.parametrize(
    ("config", "names"),
    [
        # a whole model whose layers hold something named fc: not a drafter
        ({"model_type": "llama"}, {"model.layers.0.fc.weight", "fc.weight", "layers.0.x"}),
        ({"model_type": "deepseek_v3"}, {"model.layers.2.eh_proj.weight"}),
        ({"model_type": "gemma4"}, {"model.language_model.layers.0.mlp.up_proj.weight"}),
    ],
)
def test_models_are_not_drafters(config: dict[str, Any], names: set[str]) -> None:
    assert recognise(config, names) is None
    assert unknown_drafter(config) is None


def test_a_drafter_of_an_unknown_kind_is_named_by_what_marks_it() -> None:
    assert unknown_drafter({"speculators_model_type": "hydra"}) == (
        "speculators_model_type 'hydra'"
    )
    assert unknown_drafter({"architectures": ["HydraDraftModel"]}) == (
        "architecture 'HydraDraftModel'"
    )
    assert recognise({"speculators_model_type": "hydra"}, {"fc.weight", "layers.0.x"}) is None


def test_the_config_is_read_through_the_kinds_paths() -> None:
    speculators = {
        "speculators_model_type": "eagle3",
        "draft_vocab_size": 128,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [1, 5, 9],
        "norm_before_fc": True,
        "transformer_layer_config": {"vocab_size": 256, "hidden_size": 64},
        "speculators_config": {"verifier": {"name_or_path": "t"}},
    }
    cfg = read_config(DRAFTER_KIND_BY_KEY["eagle3-speculators"], speculators)
    assert (cfg.vocab, cfg.hidden, cfg.target_hidden, cfg.draft_vocab) == (256, 64, 64, 128)
    assert (cfg.taps, cfg.taps_key) == ([1, 5, 9], "eagle_aux_hidden_state_layer_ids")
    assert cfg.flags == {"norm_before_fc": True}
    assert cfg.verifier == {"name_or_path": "t"}
    native = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3]}, "hidden_size": 8}
    cfg = read_config(DRAFTER_KIND_BY_KEY["eagle3"], native)
    assert (cfg.taps, cfg.hidden, cfg.target_hidden) == ([2, 3], 8, 8)


def test_a_target_that_keeps_a_dspark_drafter_under_mtp_says_so() -> None:
    assert dspark_inside({"dspark_block_size": 16, "dspark_markov_rank": 4}) == (
        "dspark_block_size",
        "dspark_markov_rank",
    )
    assert dspark_inside({"num_nextn_predict_layers": 1}) == ()


@pytest.mark.parametrize(
    ("declared", "status", "end"),
    [
        (0, "pass", "a DSpark drafter, not MTP layers, so none is counted"),
        (
            1,
            "warn",
            "and also declares 1 MTP layer(s) (num_nextn_predict_layers): an engine told "
            "method=mtp may half-load the drafter as an MTP layer (vllm#41834)",
        ),
    ],
)
def test_mtp_tensors_of_a_dspark_target_are_not_counted_as_mtp_layers(
    run_cli, tmp_path, declared: int, status: str, end: str
) -> None:
    """DeepSeek-V4-Flash-0731's config keys on the V4 fixture: its ``mtp.*`` tensors are then
    the drafter the keys name, and their lack of MTP parts is no finding."""
    import json
    import shutil

    from tests.conftest import FIXTURES

    target = tmp_path / "v4"
    shutil.copytree(FIXTURES / "deepseek_v4", target)
    config = json.loads((target / "config.json").read_text())
    config |= {"dspark_block_size": 16, "dspark_target_layer_ids": [0, 1]}
    config["num_nextn_predict_layers"] = declared
    (target / "config.json").write_text(json.dumps(config))
    run = run_cli("inspect", target, "--format", "json")
    report = json.loads(run.stdout)
    assert run.exit_code == 0
    [count] = next(c for c in report["checks"] if c["name"] == CheckName.MTP_COUNT)["findings"]
    assert count["status"] == status
    assert count["message"].startswith(
        "its config names a DSpark drafter (dspark_block_size, dspark_target_layer_ids), held "
        "in 43 mtp.* tensors"
    )
    assert count["message"].endswith(end)
    layers = next(c for c in report["checks"] if c["name"] == CheckName.MTP_LAYERS)
    assert [f["status"] for f in layers["findings"]] == ["skip"]
