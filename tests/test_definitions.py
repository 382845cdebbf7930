"""The main model held to its family's definition: every parameter the model's own code builds
a layer with (``src/mtpcheck/families/definitions.json``, written by
``scripts/model_definitions.py`` with transformers on the meta device). The losses a peer
comparison cannot see, a tensor gone from every layer of a kind or from the one layer of its
kind, fail and are named in full."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.families import analyse
from mtpcheck.families.definitions import definition_of, without_definition
from mtpcheck.families.published import PUBLISHED_DIR
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES
from tests.main_model_losses import Without

ROOT = Path(__file__).resolve().parent.parent


def _failing(fixture: str, lost: str) -> list[tuple[str, str]]:
    """``main-model``'s failing findings on ``fixture`` without every tensor matching the
    regular expression ``lost`` (MTP layers included)."""
    ckpt = open_checkpoint(FIXTURES / fixture)
    gone = [n for n in ckpt.tensors if re.fullmatch(lost, n)]
    assert gone, lost
    tensors = {n: m for n, m in ckpt.tensors.items() if n not in gone}
    check = main_model_check(Without(ckpt, tensors), analyse(ckpt.config, tensors, None))
    return [(f.subject, f.message) for f in check.findings if f.status.value == "fail"]


# the six losses that passed before: each is a checkpoint transformers loads with missing keys
@pytest.mark.parametrize(
    ("fixture", "lost", "subject", "named"),
    [
        # DeepSeek-V3's dense first layer without its MLP's gate projection
        ("deepseek_v3", r"model\.layers\.0\.mlp\.gate_proj\.weight", "main layer 0",
         "model.layers.0.mlp.gate_proj.weight"),
        # GLM-4.5 with a norm gone from every main layer (and the MTP layer)
        ("glm4_moe", r"model\.layers\.\d+\.post_attention_layernorm\.weight", "main layer 0",
         "model.layers.0.post_attention_layernorm.weight"),
        # DeepSeek-V3's router bias gone from every layer, the MTP block's included
        ("deepseek_v3", r".*e_score_correction_bias", "main layer 1",
         "model.layers.1.mlp.gate.e_score_correction_bias"),
        # Nemotron-H's Mamba layer without D
        ("nemotron_h", r"backbone\.layers\.0\.mixer\.D", "main layer 0",
         "backbone.layers.0.mixer.D"),
        # Qwen3-Next's linear-attention layer without dt_bias
        ("qwen3_next", r"model\.layers\.0\.linear_attn\.dt_bias", "main layer 0",
         "model.layers.0.linear_attn.dt_bias"),
        # Step-3.7's one sparse layer without its shared expert
        ("step3p7", r"model\.layers\.1\.share_expert\..*", "main layer 1",
         "model.layers.1.share_expert.down_proj.weight"),
    ],
)  # fmt: skip
def test_a_loss_no_peer_shows_fails_by_name(
    fixture: str, lost: str, subject: str, named: str
) -> None:
    failing = _failing(fixture, lost)
    assert any(s.startswith(subject) and named in m for s, m in failing), failing
    message = next(m for s, m in failing if s.startswith(subject))
    built = " / ".join(definition_of(_family(fixture)).built_by)  # type: ignore[union-attr]
    assert f"transformers {_transformers()}'s {built} builds a layer of this kind" in message


def _family(fixture: str) -> str:
    ckpt = open_checkpoint(FIXTURES / fixture)
    family = analyse(ckpt.config, ckpt.tensors, None).family
    assert family is not None
    return family.key


def _transformers() -> str:
    table = json.loads((ROOT / "src/mtpcheck/families/definitions.json").read_text())
    return str(table["produced_by"]["transformers"])


def test_the_pass_line_says_what_the_layers_were_held_to(run_cli) -> None:
    run = run_cli("inspect", FIXTURES / "deepseek_v3", "--format", "json")
    [found] = next(
        c for c in json.loads(run.stdout)["checks"] if c["name"] == CheckName.MAIN_MODEL
    )["findings"]
    assert found["message"].endswith(
        f"each layer held to the others of its kind (2 kinds) and to transformers "
        f"{_transformers()}'s DeepseekV3ForCausalLM"
    )


def test_families_without_a_definition_say_why() -> None:
    without = without_definition()
    assert without["deepseek_v4"] == "transformers has no class"
    assert without["kimi_k3"] == "transformers has no class"
    for key in without:
        assert definition_of(key) is None


def test_the_definitions_are_what_this_transformers_builds() -> None:
    """Regenerated here and compared: a transformers release that renames or adds a
    parameter, or a family's new fixture, changes what is built (rewrite the file with the
    script); the versions alone may differ."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "model_definitions.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr


PUBLISHED = PUBLISHED_DIR


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v3__DeepSeek-V3",  # 61 layers, 3 dense: one of each kept
        "nemotron_h__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",  # the hybrid pattern
        "qwen3_5_moe__Qwen3.5-35B-A3B",  # layer types, a VLM's names
        "glm_moe_dsa__GLM-5",  # the indexer
    ],
)
def test_every_single_tensor_loss_of_a_published_config_fails(name: str, tmp_path: Path) -> None:
    """``roundtrip --synthetic``'s builder on the published config: the checkpoint passes,
    and each of its main-model tensors taken out fails and is named."""
    from mtpcheck.convert.synthetic import build_synthetic
    from tests.main_model_losses import loss_is_named, main_tensors

    built = build_synthetic(PUBLISHED / f"{name}.json", tmp_path / "tiny")
    ckpt = open_checkpoint(built)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    assert main_model_check(ckpt, analysis).status.value == "pass"
    top, layers = main_tensors(ckpt, analysis)
    unseen = [n for n in [*top, *layers] if not loss_is_named(ckpt, analysis, n)]
    assert unseen == []
    assert len(layers) > 20


def test_a_tensor_no_layer_of_the_definition_holds_warns() -> None:
    """A layer holding a parameter its definition never builds (an old export's rotary
    buffer) is left to its peers, and the name is warned of."""
    import dataclasses

    ckpt = open_checkpoint(FIXTURES / "deepseek_v3")
    tensors = dict(ckpt.tensors)
    norm = tensors["model.layers.1.input_layernorm.weight"]
    extra = "model.layers.1.self_attn.rotary_emb.inv_freq"
    tensors[extra] = dataclasses.replace(norm, name=extra)
    check = main_model_check(Without(ckpt, tensors), analyse(ckpt.config, tensors, None))
    found = [(f.status.value, f.subject, f.message) for f in check.findings]
    warned = [f for f in found if f[0] == "warn"]
    assert [w[1] for w in warned] == ["main layers"]
    assert warned[0][2].startswith("1 tensor(s) no layer of transformers ")
    assert warned[0][2].endswith(f": {extra}")
    [passed] = [f for f in found if f[0] == "pass"]
    assert passed[2].endswith("DeepseekV3ForCausalLM (1 of them); 1 the only one of its kind, "
                              "checked for presence and experts only")  # fmt: skip
