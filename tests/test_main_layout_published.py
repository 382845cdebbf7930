"""What mtpcheck reads from thirteen published configs (src/mtpcheck/families/published, with
their sources): the decoder layers and each one's kind, as each model's maker lays them out.
The main-model check holds layers of one kind to each other, so a kind read wrong would be a
false alarm on the real release."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from mtpcheck.families import declared_count, detect_family
from mtpcheck.families.main_layout import MainLayout, main_layout
from mtpcheck.families.published import PUBLISHED_DIR

CONFIGS = PUBLISHED_DIR


def _layout(name: str) -> MainLayout:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    family = detect_family(config)
    assert family is not None, name
    return main_layout(family, config, mtp=declared_count(config, family, None).value or 0)


def _kinds(layout: MainLayout, *facts: str) -> Counter[tuple[str, ...]]:
    """How many layers of each kind, by the given facts alone."""
    return Counter(tuple(dict(kind).get(f, "-") for f in facts) for kind in layout.kinds)


@pytest.mark.parametrize(
    ("name", "layers", "experts", "dense"),
    [
        ("deepseek_v3__DeepSeek-V3", 61, 256, 3),
        ("deepseek_v32__DeepSeek-V3.2", 61, 256, 3),
        ("kimi_k2__Kimi-K2-Instruct", 61, 384, 1),
        ("glm4_moe__GLM-4.7", 92, 160, 3),
        ("glm_moe_dsa__GLM-5", 78, 256, 3),
        ("step3p5__Step-3.5-Flash", 45, 288, 3),
    ],
)
def test_dense_first_layers_then_moe(name: str, layers: int, experts: int, dense: int) -> None:
    layout = _layout(name)
    assert (layout.layers, layout.experts, layout.tied) == (layers, experts, False)
    assert layout.moe_layers == frozenset(range(dense, layers))


def test_deepseek_v4_hash_routed_first_layers_and_compression_ratios() -> None:
    """No dense layer; the first 3 hash-routed; ``compress_ratios`` lists the 43 main layers
    and the MTP layer."""
    layout = _layout("deepseek_v4__DeepSeek-V4-Flash")
    assert layout.layers == 43 and layout.moe_layers == frozenset(range(43))
    assert _kinds(layout, "mlp")[("hash_moe",)] == 3
    assert set(_kinds(layout, "compress_ratios")) == {("0",), ("4",), ("128",)}


def test_qwen3_next_full_attention_every_fourth_layer() -> None:
    layout = _layout("qwen3_next__Qwen3-Next-80B-A3B-Thinking")
    assert _kinds(layout, "attention", "mlp") == {("linear", "moe"): 36, ("full", "moe"): 12}


@pytest.mark.parametrize(
    ("name", "moe"), [("qwen3_5_moe__Qwen3.5-35B-A3B", 40), ("qwen3_5__Qwen3.5-27B", None)]
)
def test_qwen3_5_layer_types_and_a_dense_model(name: str, moe: int | None) -> None:
    layout = _layout(name)
    linear, full = (30, 10) if moe else (48, 16)
    assert _kinds(layout, "layer_types") == {
        ("linear_attention",): linear,
        ("full_attention",): full,
    }
    assert (len(layout.moe_layers) if layout.moe_layers is not None else None) == moe


@pytest.mark.parametrize(
    ("name", "fact", "counts"),
    [
        (
            "nemotron_h__NVIDIA-Nemotron-3-Super-120B-A12B-FP8",
            "hybrid_override_pattern",
            {("M",): 40, ("E",): 40, ("*",): 8},
        ),
        (
            "nemotron_h__NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16",
            "layers_block_type",
            {("mamba",): 48, ("moe",): 48, ("attention",): 12},
        ),
    ],
)
def test_nemotron_hybrid_patterns(name: str, fact: str, counts: dict) -> None:
    layout = _layout(name)
    assert _kinds(layout, fact) == counts
    assert (
        layout.moe_layers is not None
        and len(layout.moe_layers) == counts[("E" if fact.endswith("pattern") else "moe",)]
    )


def test_minimax_m2_one_kind_all_moe() -> None:
    layout = _layout("minimax_m2__MiniMax-M2.7")
    assert layout.layers == 62 and layout.experts == 256 and len(set(layout.kinds)) == 1
