"""Name templates: every template the family registry holds fills to the exact name and reads
back the numbers it was filled with, and the depth they stand for."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from mtpcheck.families import FAMILIES
from mtpcheck.families.name_templates import (
    PLACEHOLDERS,
    LayerNames,
    NameTemplate,
    depth_of,
    fill_template,
)

_NAME = re.compile(r"[\w.{}]+")
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


def _strings(value: Any) -> set[str]:
    """Every string held anywhere in ``value`` (a family record, its parts, their tuples)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return set().union(*(_strings(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, tuple | list | set | frozenset):
        return set().union(*map(_strings, value))
    if isinstance(value, dict):
        return _strings(tuple(value.items()))
    return {value} if isinstance(value, str) else set()


def _templates() -> list[str]:
    """The registry's name templates: tensor names with at least one layer placeholder."""
    return sorted(
        s
        for family in FAMILIES
        for s in _strings(family)
        if _NAME.fullmatch(s)
        and _PLACEHOLDER.search(s)
        and set(_PLACEHOLDER.findall(s)) <= set(PLACEHOLDERS)
    )


TEMPLATES = _templates()


def test_the_registry_is_searched() -> None:
    """The search finds the templates of the catalog, every placeholder kind among them."""
    assert len(TEMPLATES) > 50
    for known in (
        "model.layers.{n}.enorm.weight",
        "model.layers.{k}.",
        "mtp.layers.{i}.",
        "mtp.layers.{last}.final_layernorm.weight",
        "mtp.layers.{d}.transformer_layer.layers.{t}.",
        "mtp.{i}.emb.tok_emb.weight",
        "blk.{n}.nextn.eh_proj.weight",
    ):
        assert known in TEMPLATES
    seen = {p for t in TEMPLATES for p in _PLACEHOLDER.findall(t)}
    assert seen == set(PLACEHOLDERS)


def _expected(template: str, i: int, base: int, span: int, k: int) -> dict[str, int]:
    """The number each placeholder of ``template`` stands for, worked out independently of
    the code under test: ``i`` is the flat index where ``{t}`` nests layers in a depth."""
    values = {
        "i": i,
        "n": base + i,
        "first": i * span,
        "last": i * span + span - 1,
        "d": i // span if "{t}" in template else i,
        "t": i % span,
        "k": k,
    }
    return {p: values[p] for p in _PLACEHOLDER.findall(template)}


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize(("i", "base", "span"), [(0, 61, 1), (2, 61, 1), (1, 7, 3), (5, 48, 3)])
def test_fill_and_match_round_trip(template: str, i: int, base: int, span: int) -> None:
    t = NameTemplate(template)
    values = _expected(template, i, base, span, k=base - 1)
    name = t.main_layer(base - 1) if "{k}" in template else t.fill(i, base, span)
    assert name == template.format(**values)
    assert t.match(name) == values
    assert t.match(name + "x") is None
    assert t.match_prefix(name + "mlp.gate.weight") == (values, len(name))
    if "{k}" not in template:
        assert fill_template(template, i, base, span) == name
        flat = "{i}" in template or "{t}" in template  # then ``i`` is a flat layer's index
        assert depth_of(t.match(name) or {}, base, span) == (i // span if flat else i)


@pytest.mark.parametrize(
    ("template", "i", "base", "span", "name"),
    [
        ("model.layers.{n}.enorm.weight", 0, 61, 1, "model.layers.61.enorm.weight"),
        ("model.layers.{n}.enorm.weight", 2, 61, 1, "model.layers.63.enorm.weight"),
        ("mtp.layers.{i}.", 4, 52, 3, "mtp.layers.4."),
        ("mtp.layers.{first}.enorm.weight", 1, 52, 3, "mtp.layers.3.enorm.weight"),
        (
            "mtp.layers.{last}.final_layernorm.weight",
            1,
            52,
            3,
            "mtp.layers.5.final_layernorm.weight",
        ),
        (
            "mtp.layers.{d}.transformer_layer.layers.{t}.",
            4,
            0,
            3,
            "mtp.layers.1.transformer_layer.layers.1.",
        ),
        ("mtp.layers.{d}.enorm.weight", 1, 0, 3, "mtp.layers.1.enorm.weight"),
        ("mtp.fc.weight", 3, 61, 1, "mtp.fc.weight"),
    ],
)
def test_exact_names(template: str, i: int, base: int, span: int, name: str) -> None:
    assert NameTemplate(template).fill(i, base, span) == name


def test_main_layer() -> None:
    main = NameTemplate("model.language_model.layers.{k}.")
    assert main.main_layer(7) == "model.language_model.layers.7."
    assert main.main_layer("12") == "model.language_model.layers.12."
    assert main.match_prefix("model.language_model.layers.7.mlp.gate.weight") == ({"k": 7}, 30)
    assert main.match_prefix("model.layers.7.mlp.gate.weight") is None


def test_fixed_templates() -> None:
    assert NameTemplate("mtp.norm.weight").fixed
    assert not NameTemplate("mtp.layers.{i}.").fixed
    assert NameTemplate("mtp.norm.weight").match("mtp.norm.weight") == {}


def test_layer_names_group_a_main_layers_names() -> None:
    names = sorted(
        [
            "model.layers.0.mlp.w",
            "model.layers.1.mlp.w",
            "model.layers.1.attn.w",
            "model.layers.2.x",
        ]
    )
    assert dict(LayerNames(names, "model.layers.{k}.", 2)) == {
        0: frozenset({"mlp.w"}),
        1: frozenset({"mlp.w", "attn.w"}),
    }


def test_expert_and_main_layer_placeholders_are_filled_by_the_template() -> None:
    """``{e}`` (the HF <-> Megatron rules' expert index) and ``{k}`` are filled, tested and
    split by ``NameTemplate`` too, so no code replaces a placeholder by hand."""
    rule = NameTemplate("mlp.experts.local_experts.{e}.linear_fc1.weight")
    assert rule.holds("e") and not rule.holds("k")
    assert rule.expert(7) == "mlp.experts.local_experts.7.linear_fc1.weight"
    assert rule.match("mlp.experts.local_experts.12.linear_fc1.weight") == {"e": 12}
    assert rule.match("mlp.experts.local_experts.x.linear_fc1.weight") is None
    assert NameTemplate("model.layers.{k}.").around("k") == ("model.layers.", ".")
    assert NameTemplate("lm_head.weight").around("k") == ("lm_head.weight", "")
    nested = NameTemplate("mtp.layers.{i}.enorm.weight").renamed("i", "d")
    assert nested.text == "mtp.layers.{d}.enorm.weight"
