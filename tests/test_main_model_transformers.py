"""The main model as transformers' own loader sees it: for every shipped fixture transformers
has a causal-LM class for, the intact checkpoint loads with no missing key and passes
``main-model``; with a decoder layer, the embedding, the final norm or the head taken out
(the ``safetensors`` library writes the copy), transformers reports keys missing and
``main-model`` fails naming that layer or tensor. Fixtures transformers cannot load (remote
code only) are listed in docs/families.md as not confirmed this way."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.families import analyse, hidden_layer_count
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES

CONFIRMED = (
    "accept_deepseek_v3",
    "accept_qwen3_next",
    "accept_step3p7",
    "bailing_hybrid",
    "deepseek_v3",
    "deepseek_v4",
    "exaone4_5",
    "exaone_moe",
    "gemma4_assistant",
    "glm4_moe",
    "glm5_next",
    "glm_moe_dsa",
    "hy_v3",
    "hy_v4",
    "mimo_v2_flash",
    "minimax_m2",
    "minimax_m3",
    "nemotron_h",
    "qwen3_5_moe",
    "qwen3_5_text",
    "qwen3_next",
    "qwen4_exp_text",
    "sarvam_moe",
    "step3p7",
)
"""Fixtures whose model transformers loads, as a causal LM or an image-text-to-text model
(docs/families.md says which families these are, and which could not be confirmed so)."""


def _load(path: Path) -> list[str]:
    """The missing keys transformers' loader reports for ``path``."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, output_loading_info=True
            )
        except ValueError:  # a vision-language model: its language model is inside
            _, info = transformers.AutoModelForImageTextToText.from_pretrained(
                path, output_loading_info=True
            )
    return sorted(info["missing_keys"])


def _copy_without(src: Path, dst: Path, drop: Any) -> None:
    """``src`` as one safetensors file, without the tensors ``drop`` picks."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(shard)))
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    kept = {n: t for n, t in tensors.items() if not drop(n)}
    assert len(kept) < len(tensors)
    save_file(kept, str(dst / "model.safetensors"), metadata={"format": "pt"})


def _main_model(path: Path) -> list[tuple[str, str]]:
    ckpt = open_checkpoint(path)
    check = main_model_check(ckpt, analyse(ckpt.config, ckpt.tensors, ckpt.config_path))
    return [(f.status.value, f.subject) for f in check.findings]


@pytest.mark.parametrize("name", CONFIRMED)
def test_transformers_and_main_model_agree(name: str, tmp_path: Path) -> None:
    source = FIXTURES / name
    assert _load(source) == []
    assert [status for status, _ in _main_model(source)] == ["pass"]

    ckpt = open_checkpoint(source)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    family = analysis.family
    assert family is not None
    layers = hidden_layer_count(family, ckpt.config)
    assert layers
    head = family.layout.main_layer_prefix.split("{k}")[0]
    tied = json.loads((source / "config.json").read_text()).get("tie_word_embeddings")
    shared = family.layout.main_shared
    top = [shared[0], family.layout.main_norm, *([] if tied else shared[1:2])]
    cases = [(n, lambda x, n=n: x == n) for n in top]
    for k in range(layers):
        prefix = f"{head}{k}."
        cases.append((f"main layer {k}", lambda x, p=prefix: x.startswith(p)))
    for i, (subject, drop) in enumerate(cases):
        damaged = tmp_path / str(i)
        _copy_without(source, damaged, drop)
        assert _load(damaged), f"transformers loads {name} without {subject}"
        failing = [s for status, s in _main_model(damaged) if status == "fail"]
        assert any(s == subject or s.startswith(subject + " (") for s in failing), (
            subject,
            failing,
        )
