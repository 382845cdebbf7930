"""Logical parameters: stored tensors grouped by the parameter they hold, and the scheme a
config declares."""

from __future__ import annotations

import pytest

from mtpcheck.families import analyse
from mtpcheck.model import TensorMeta
from mtpcheck.params import Method, Role, group, logical_name, scheme_of, stored_forms
from mtpcheck.params.parts import PARTS

W4A16 = ("weight_packed", "weight_scale", "weight_shape")
"""What compressed-tensors' pack-quantized W4A16 stores for one Linear."""


def _meta(name: str, dtype: str) -> TensorMeta:
    shape = (2,) if "norm" in name else (2, 2)  # norms are vectors, the rest matrices
    return TensorMeta(name, dtype, shape, "f", 0, 8)


def test_parts_group_under_the_weight_they_replace() -> None:
    names = [f"m.q_proj.{s}" for s in W4A16] + ["m.q_proj.bias", "m.norm.weight"]
    params = group(names)
    assert sorted(params) == ["m.norm.weight", "m.q_proj.bias", "m.q_proj.weight"]
    q = params["m.q_proj.weight"]
    assert q.parts == (
        (Role.PACKED, "m.q_proj.weight_packed"),
        (Role.SCALE, "m.q_proj.weight_scale"),
        (Role.SHAPE, "m.q_proj.weight_shape"),
    )
    assert q.part(Role.WEIGHT) is None and q.quantized({})
    assert params["m.norm.weight"].parts == ((Role.WEIGHT, "m.norm.weight"),)


def test_generic_autoawq_names_are_parts_only_beside_a_packed_weight() -> None:
    params = group(["a.qweight", "a.qzeros", "a.scales", "b.scales", "c.weight_scale_inv"])
    assert params["a.weight"].stored == ("a.qweight", "a.scales", "a.qzeros")
    assert params["b.scales"].parts == ((Role.WEIGHT, "b.scales"),)  # no b.qweight: a tensor
    assert logical_name("c.weight_scale_inv") == ("c.weight", Role.SCALE)
    assert logical_name("b.scales") == ("b.scales", Role.WEIGHT)
    assert logical_name("b.scales", {"b"}) == ("b.weight", Role.SCALE)


def test_quantized_is_decided_by_the_values_not_the_side_parts() -> None:
    tensors = {
        "fp8.weight": _meta("fp8.weight", "F8_E4M3"),
        "fp8.weight_scale_inv": _meta("fp8.weight_scale_inv", "F32"),
        "int8.weight": _meta("int8.weight", "I8"),
        "bf16.weight": _meta("bf16.weight", "BF16"),
        "bf16.input_scale": _meta("bf16.input_scale", "F32"),
    }
    params = group(tensors)
    assert {n: p.quantized(tensors) for n, p in params.items()} == {
        "fp8.weight": True,
        "int8.weight": True,
        "bf16.weight": False,
    }


def test_stored_forms_cover_every_part_and_keep_placeholders() -> None:
    forms = stored_forms("model.layers.{n}.eh_proj.weight")
    assert forms[0] == "model.layers.{n}.eh_proj.weight"
    assert len(forms) == len(PARTS) and len(set(forms)) == len(forms)
    assert "model.layers.{n}.eh_proj.weight_packed" in forms
    assert "model.layers.{n}.eh_proj.qweight" in forms
    assert stored_forms("model.layers.{n}.eh_proj.bias") == ("model.layers.{n}.eh_proj.bias",)


def test_every_suffix_is_one_part() -> None:
    suffixes = [p.suffix for p in PARTS]
    assert len(set(suffixes)) == len(suffixes)
    assert all(
        logical_name(f"x.{s}", {"x"})[1] is p.role for s, p in zip(suffixes, PARTS, strict=True)
    )


# --- schemes, as the tools' configs declare them ---


def test_compressed_tensors_ignore_takes_names_and_re_patterns() -> None:
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*mtp.*", "re:model[.]layers[.]2[.].*"],
        }
    }
    scheme = scheme_of(config)
    assert (scheme.method, scheme.formats) == (Method.COMPRESSED_TENSORS, ("pack-quantized",))
    assert scheme.ignoring_entry("lm_head") == "lm_head"
    assert scheme.ignoring_entry("model.lm_head") is None  # names match whole
    assert scheme.ignoring_entry("mtp.fc") == "re:.*mtp.*"
    assert scheme.ignoring_entry("model.layers.2.eh_proj") == "re:model[.]layers[.]2[.].*"
    assert scheme.ignoring_entry("model.layers.1.self_attn.q_proj") is None


def test_fp8_block_and_modelopt_schemes() -> None:
    fp8 = scheme_of(
        {
            "quantization_config": {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "weight_block_size": [128, 128],
                "modules_to_not_convert": ["mtp"],
            }
        }
    )
    assert (fp8.method, fp8.block_size) == (Method.FP8, (128, 128))
    assert fp8.ignoring_entry("model.mtp.fc") == "mtp"
    assert fp8.ignoring_entry("model.layers.0.mlp") is None
    modelopt = scheme_of(
        {}, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head", "*mtp*"]}}
    )
    assert (modelopt.method, modelopt.formats) == (Method.MODELOPT, ("NVFP4",))
    assert modelopt.ignoring_entry("mtp.layers.0.mlp") == "*mtp*"
    assert modelopt.ignoring_entry("model.layers.0.mlp") is None


@pytest.mark.parametrize(
    ("config", "method"),
    [
        ({}, Method.NONE),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, Method.AWQ),
        ({"quantization_config": {"quant_method": "mxfp4"}}, Method.OTHER),
        ({"text_config": {"quantization_config": {"quant_method": "gptq"}}}, Method.GPTQ),
        ({"quantization_config": ["not", "a", "mapping"]}, Method.NONE),
    ],
)
def test_scheme_methods(config: dict, method: Method) -> None:
    assert scheme_of(config).method is method


# --- completeness on logical parameters ---

CONFIG = {"model_type": "deepseek_v3", "num_hidden_layers": 1, "num_nextn_predict_layers": 1}
_LINEARS = ("self_attn.o_proj", "mlp.down_proj")


def _checkpoint(main: tuple[str, ...], mtp: tuple[str, ...], mtp_dtype: str = "BF16") -> dict:
    """A one-layer DeepSeek-style checkpoint: main layer 0 and MTP layer 1, each Linear stored
    with the given suffixes."""
    tensors = {
        n: _meta(n, "BF16")
        for n in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight")
    }
    for k, suffixes in ((0, main), (1, mtp)):
        for linear in _LINEARS:
            for s in suffixes:
                name = f"model.layers.{k}.{linear}.{s}"
                dtype = mtp_dtype if k and s == "weight" else "BF16"
                tensors[name] = _meta(name, "I32" if s == "weight_packed" else dtype)
        tensors[f"model.layers.{k}.input_layernorm.weight"] = _meta("norm", "BF16")
    for rel in ("enorm", "hnorm", "shared_head.norm", "embed_tokens", "shared_head.head"):
        tensors[f"model.layers.1.{rel}.weight"] = _meta(rel, "BF16")
    for s in mtp:
        dtype = "I32" if s == "weight_packed" else mtp_dtype if s == "weight" else "BF16"
        tensors[f"model.layers.1.eh_proj.{s}"] = _meta("eh_proj", dtype)
    return tensors


def test_mtp_kept_bf16_beside_packed_main_layers_is_complete() -> None:
    layer = analyse(CONFIG, _checkpoint(W4A16, ("weight",))).layers[0]
    assert layer.missing == ()


def test_mtp_quantized_like_the_main_layers_is_complete() -> None:
    layer = analyse(CONFIG, _checkpoint(W4A16, W4A16)).layers[0]
    assert layer.missing == () and "model.layers.1.eh_proj.weight_packed" in layer.present


def test_packed_mtp_lacking_a_side_part_is_incomplete() -> None:
    tensors = _checkpoint(W4A16, W4A16)
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    assert analyse(CONFIG, tensors).layers[0].missing == (
        "model.layers.1.mlp.down_proj.weight_scale",
    )


def test_a_linear_lost_in_every_form_lists_every_stored_part() -> None:
    tensors = _checkpoint(W4A16, W4A16)
    for s in W4A16:
        del tensors[f"model.layers.1.self_attn.o_proj.{s}"]
    assert analyse(CONFIG, tensors).layers[0].missing == tuple(
        f"model.layers.1.self_attn.o_proj.{s}" for s in W4A16
    )
