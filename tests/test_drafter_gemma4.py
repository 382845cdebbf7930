"""The Gemma-4 assistant against a Gemma-4 target that transformers itself saves: the
backbone width, the vocabulary and the layer types the assistant reads the KV cache of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES
from tests.report_views import failing_of

ASSISTANT = FIXTURES / "gemma4_assistant"


def _target(dest: Path, hidden: int, layer_types: list[str]) -> Path:
    import transformers

    config = transformers.Gemma4TextConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=32,
        num_hidden_layers=len(layer_types),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        layer_types=layer_types,
        sliding_window=8,
    )
    transformers.Gemma4ForCausalLM(config).save_pretrained(dest)
    return dest


@pytest.mark.parametrize(
    ("hidden", "layer_types", "failing"),
    [
        (24, ["sliding_attention", "sliding_attention", "full_attention"], []),
        (
            16,
            ["sliding_attention", "full_attention"],
            [
                (
                    "pairing-shape",
                    "width",
                    "drafter 24, target 16: built for another model's hidden "
                    "states; the engine refuses it or drafts from the wrong features",
                )
            ],
        ),
        (
            24,
            ["sliding_attention", "full_attention", "full_attention"],
            [
                (
                    "pairing-shape",
                    "layer_types",
                    "['sliding_attention'] not among the target's last two layers' types "
                    "['full_attention']: there is no KV cache of that type for it to read "
                    "(SGLang refuses it)",
                )
            ],
        ),
    ],
)
def test_the_assistant_against_its_target(
    run_cli, tmp_path: Path, hidden: int, layer_types: list[str], failing: list
) -> None:
    target = _target(tmp_path / "target", hidden, layer_types)
    run = run_cli("inspect", ASSISTANT, "--target", target, "--format", "json")
    report = json.loads(run.stdout)
    assert (run.exit_code, failing_of(report)) == (1 if failing else 0, failing)
    kinds = [c for c in report["checks"] if c["name"] == CheckName.DRAFTER_KIND]
    assert kinds[0]["findings"][0]["subject"] == "gemma4-assistant"
