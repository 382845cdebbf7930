"""The family registry locates MTP layers and judges their completeness."""

from __future__ import annotations

import re

import pytest

from mtpcheck.errors import ConfigError
from mtpcheck.families import FAMILIES, FAMILY_BY_MODEL_TYPE, Drafter, analyse, detect_family
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import TensorMeta
from tests.conftest import FAMILY_FIXTURES, FIXTURES

EXPECTED = {
    # fixture: (family, declared, declared_by, mtp prefix, MTP tensors, copies)
    "deepseek_v3": ("deepseek_v3", 1, "num_nextn_predict_layers", "model.layers.2.", 32, 2),
    "glm4_moe": ("glm4_moe", 1, "num_nextn_predict_layers", "model.layers.2.", 34, 2),
    "glm_moe_dsa": ("glm_moe_dsa", 1, "num_nextn_predict_layers", "model.layers.2.", 35, 0),
    "qwen3_next": ("qwen3_next", 1, None, "mtp.layers.0.", 29, 0),
    "mimo": ("mimo", 1, "num_nextn_predict_layers", "model.mtp_layers.0.", 16, 0),
}


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_fixture_layouts(name: str) -> None:
    ckpt = open_checkpoint(FIXTURES / name)
    a = analyse(ckpt.config, ckpt.tensors)
    family, declared, key, prefix, count, copies = EXPECTED[name]
    assert a.family is not None and a.family.key == family
    assert a.declared.value == declared
    assert a.declared.from_key == (key is not None)
    if key:
        assert a.declared.source == key
    assert [(layer.index, layer.prefix) for layer in a.layers] == [(0, prefix)]
    assert len(a.layers[0].present) == count and a.layers[0].missing == ()
    assert len(a.copies) == copies
    assert a.complete_layers == 1


def _meta(name: str, dtype: str = "BF16") -> TensorMeta:
    return TensorMeta(name, dtype, (2,), "f", 0, 4)


def _layer(prefix: str, experts: int, fp8: bool = False) -> dict[str, TensorMeta]:
    names = [f"{prefix}self_attn.o_proj.weight", f"{prefix}input_layernorm.weight"]
    for e in range(experts):
        names += [f"{prefix}mlp.experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down")]
    out = {n: _meta(n, "F8_E4M3" if fp8 and "experts" in n else "BF16") for n in names}
    if fp8:
        out.update(
            {n + "_scale_inv": _meta(n + "_scale_inv", "F32") for n in names if "experts" in n}
        )
    return out


def _deepseek(
    mtp_experts: int, fp8_main: bool = True, fp8_mtp: bool = True
) -> dict[str, TensorMeta]:
    tensors = {n: _meta(n) for n in ("model.embed_tokens.weight", "lm_head.weight")}
    tensors.update(_layer("model.layers.0.", 4, fp8_main))
    tensors.update(_layer("model.layers.1.", 0))
    tensors.update(_layer("model.layers.2.", mtp_experts, fp8_mtp))
    for rel in (
        "enorm",
        "hnorm",
        "eh_proj",
        "shared_head.norm",
        "embed_tokens",
        "shared_head.head",
    ):
        tensors[f"model.layers.2.{rel}.weight"] = _meta(f"model.layers.2.{rel}.weight")
    return tensors


CONFIG = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "num_nextn_predict_layers": 1}


def test_mtp_layer_missing_half_its_experts_is_incomplete() -> None:
    a = analyse(CONFIG, _deepseek(mtp_experts=2))
    layer = a.layers[0]
    assert a.reference_layers == {0: "model.layers.0."}
    assert layer.missing == tuple(
        sorted(
            f"model.layers.2.mlp.experts.{e}.{p}_proj.weight{s}"
            for e in (2, 3)
            for p in ("gate", "up", "down")
            for s in ("", "_scale_inv")
        )
    )


def test_high_precision_mtp_needs_no_quantisation_scales() -> None:
    assert analyse(CONFIG, _deepseek(4, fp8_mtp=False)).layers[0].missing == ()
    fp8 = _deepseek(4)
    del fp8["model.layers.2.mlp.experts.0.up_proj.weight_scale_inv"]
    assert analyse(CONFIG, fp8).layers[0].missing == (
        "model.layers.2.mlp.experts.0.up_proj.weight_scale_inv",
    )


def test_missing_mtp_only_tensor_and_copy_are_named() -> None:
    tensors = _deepseek(4)
    del tensors["model.layers.2.eh_proj.weight"]
    del tensors["model.layers.2.shared_head.head.weight"]
    assert analyse(CONFIG, tensors).layers[0].missing == (
        "model.layers.2.eh_proj.weight",
        "model.layers.2.shared_head.head.weight",
    )


def test_declared_layers_without_weights_are_listed_empty() -> None:
    tensors = {k: v for k, v in _deepseek(4).items() if not k.startswith("model.layers.2.")}
    a = analyse({**CONFIG, "num_nextn_predict_layers": 2}, tensors)
    assert [(layer.index, layer.present) for layer in a.layers] == [(0, ()), (1, ())]
    assert a.complete_layers == 0


@pytest.mark.parametrize("value", [-1, "1", 1.0, True])
def test_count_of_wrong_type_or_negative_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match=r"cfg\.json: num_nextn_predict_layers is .* expected"):
        analyse({**CONFIG, "num_nextn_predict_layers": value}, {}, "cfg.json")


def test_null_count_declares_no_mtp_layer() -> None:
    """Megatron-Bridge writes ``mtp_num_layers: null`` when MTP is off: a statement about the
    checkpoint (0 layers), not unreadable input."""
    a = analyse({**CONFIG, "num_nextn_predict_layers": None}, _deepseek(4), "cfg.json")
    assert (a.declared.value, a.declared.source, a.declared.from_key) == (
        0,
        "num_nextn_predict_layers: null",
        True,
    )
    megatron = analyse({"model_type": "megatron", "mtp_num_layers": None}, {})
    assert (megatron.declared.value, megatron.declared.source) == (0, "mtp_num_layers: null")


def test_null_hidden_layer_count_is_still_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cfg\.json: num_hidden_layers is None; expected"):
        analyse({**CONFIG, "num_hidden_layers": None}, {}, "cfg.json")


def test_count_under_text_config_is_found() -> None:
    config = {"model_type": "qwen3_next", "text_config": {"mtp_num_hidden_layers": 2}}
    a = analyse(config, {})
    assert (a.declared.value, a.declared.source) == (2, "text_config.mtp_num_hidden_layers")


def test_unknown_family_uses_name_heuristics() -> None:
    tensors = {
        n: _meta(n)
        for n in (
            "model.layers.0.mlp.w",
            "model.layers.3.eh_proj.weight",
            "model.layers.3.mlp.w",
            "model.mtp.layers.1.norm.weight",
            "model.norm.weight",
        )
    }
    a = analyse({"model_type": "newthing", "num_hidden_layers": 3, "num_mtp_layers": 2}, tensors)
    assert a.family is None and a.declared.value == 2 and a.declared.source == "num_mtp_layers"
    assert {layer.index: layer.present for layer in a.layers} == {
        0: ("model.layers.3.eh_proj.weight", "model.layers.3.mlp.w"),
        1: ("model.mtp.layers.1.norm.weight",),
    }


def test_family_detection_by_architecture_when_model_type_is_absent() -> None:
    family = detect_family({"architectures": ["MiMoForCausalLM"]})
    assert family is not None and family.key == "mimo"
    assert detect_family({"model_type": "llama"}) is None


def test_registry_is_consistent() -> None:
    keys = [f.key for f in FAMILIES]
    assert len(keys) == len(set(keys))
    model_types = [t for f in FAMILIES for t in f.model_types]
    assert len(model_types) == len(set(model_types)) == len(FAMILY_BY_MODEL_TYPE)
    for f in FAMILIES:
        if f.drafter is Drafter.INSIDE:  # a family without MTP layers has no projection
            assert f.layout.projection in f.layout.specific, f.key
        assert re.search(r"\{[ind]\}", f.layout.layer_prefix), f.key
        assert f.count.keys, f.key
    required = {
        "deepseek_v3",
        "deepseek_v32",
        "kimi_k2",
        "glm4_moe",
        "glm4_moe_lite",
        "glm_moe_dsa",
        "qwen3_next",
        "mimo",
        "ernie4_5_moe",
        "longcat_flash",
        "step3p5",
    }
    assert required <= set(FAMILY_BY_MODEL_TYPE)


def test_capability_records_are_consistent() -> None:
    """One record per family says what each part of mtpcheck can do with it."""
    from mtpcheck.convert import megatron_config

    layouts = megatron_config.layouts()
    assert set(layouts) == set(megatron_config.LAYOUT_KWARGS)
    for f in FAMILIES:
        writer = f.support.writer
        if writer is not None:  # a writable family is mappable, and its layout is known
            assert f.megatron is not None, f.key
            assert layouts[writer.layout] is FAMILY_BY_MODEL_TYPE[writer.layout].support.writer
            assert writer.spec in ("local", "te"), f.key
        if f.megatron is not None:  # the mapping maps the MTP head's own tensors
            assert f.layout.head_parts is not None, f.key
        if f.support.accept.measurable:
            assert f.layout.head_parts and not f.support.accept.why_not, f.key
    writable = {f.key: w.layout for f in FAMILIES if (w := f.support.writer) is not None}
    assert writable == {
        "deepseek_v3": "deepseek_v3",
        "kimi_k2": "deepseek_v3",
        "glm4_moe": "glm4_moe",
        "glm_moe_dsa": "glm_moe_dsa",
        "qwen3_next": "qwen3_next",
        "mimo": "mimo",
        "qwen3_5_text": "qwen3_next",  # the same megatron-core layout (Megatron-Bridge 0.6)
    }
    measurable = [f.key for f in FAMILIES if f.support.accept.measurable]
    assert measurable == [
        "deepseek_v3",
        "glm4_moe",
        "step3p7",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_text",
    ]
    from_command_line = [f.key for f in FAMILIES if f.count.from_command_line]
    assert from_command_line == ["megatron", "megatron_hybrid"]


def test_serving_facts_sit_on_the_family_records() -> None:
    """What engines do is part of each family's record, so no check can name a family that
    does not exist."""
    with_defaults = [f.key for f in FAMILIES if f.serving.defaults]
    assert with_defaults == ["deepseek_v3", "deepseek_v32", "kimi_k2", "glm_moe_dsa"]
    assert [f.key for f in FAMILIES if f.serving.limits] == ["nemotron_h"]
    with_copies = [f.key for f in FAMILIES if f.serving.stored_copies]
    assert with_copies == ["deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe"]
    assert [f.key for f in FAMILIES if f.support.build_as] == ["kimi_k2", "mimo"]


def test_family_record_is_composed_of_parts() -> None:
    """A record is a handful of fields, each part answering one question."""
    from dataclasses import fields

    from mtpcheck.families.interface import MtpFamily

    assert len(fields(MtpFamily)) <= 12


def test_no_source_tests_a_family_by_its_key() -> None:
    """What sets a family (or a drafter kind) apart is a field of its record (GGUF's keys under
    the architecture, Megatron's hybrid form, the Gemma-4 assistant reading the target's KV
    cache), so no module compares a family's or a kind's key with a name."""
    from pathlib import Path

    import mtpcheck

    src = Path(mtpcheck.__file__).parent
    found = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if re.search(r"(family|kind)\.key\s*[!=]=|\bis (MEGATRON|GGUF)\b", path.read_text())
    ]
    assert found == []


def test_a_megatron_checkpoint_is_read_as_its_hybrid_form_by_its_record() -> None:
    megatron = detect_family({"model_type": "megatron"})
    assert megatron is not None and megatron.nested_as == "megatron_hybrid"
    hybrid = detect_family({"model_type": "megatron", "mtp_hybrid_override_pattern": "*E"})
    assert hybrid is not None and hybrid.key == "megatron_hybrid"
