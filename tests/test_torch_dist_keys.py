"""The torch_dist key scheme's two directions are inverses of each other.

The writer maps a canonical name forward to a sharded key for the layout it writes
(``to_sharded_key``); a reader maps the key back without knowing that layout
(``from_sharded_key``). Generated layouts and canonical names (decoder and MTP layers,
experts, norms under every layer spec, SwiGLU ``linear_fc1``, gated-delta-net row parts, MLA
norms, top-level and unknown names) check that going back gives the name again, at every
index of the prepended axes and for every row part, and that no two names share a stored
key. Exact examples pin the keys megatron-core writes.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpcheck.formats.torch_dist_keys import (
    FUSED_NORMS,
    ROW_PARTS,
    KeyTemplate,
    Layout,
    NormSpec,
    Placement,
    canonical_name,
    from_sharded_key,
    gated_delta_net_row_parts,
    row_part_order,
    split_row_part,
    to_sharded_key,
)
from tests.conftest import FIXTURES

PROPERTY = settings(derandomize=True, deadline=None, max_examples=200)

NORMS = tuple(
    f"{norm}.{kind}"
    for norm in ("input_layernorm", "pre_mlp_layernorm")
    for kind in ("weight", "bias")
)
ATTENTION = (
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight",
    "self_attention.q_layernorm.weight",
    "self_attention.k_layernorm.weight",
)
MLA = (
    "self_attention.linear_q_down_proj.weight",
    "self_attention.linear_q_up_proj.weight",
    "self_attention.linear_kv_down_proj.weight",
    "self_attention.linear_kv_up_proj.weight",
    "self_attention.kv_layernorm.weight",
    "self_attention.core_attention.indexer.linear_wq_b.weight",
)
ROW_SPLIT = ("self_attention.in_proj.weight", "self_attention.conv1d.weight")
GATED_DELTA_NET = (
    "self_attention.dt_bias",
    "self_attention.A_log",
    "self_attention.out_norm.weight",
    "self_attention.out_proj.weight",
)
MLP = (
    "mlp.linear_fc1.weight",
    "mlp.linear_fc1.bias",
    "mlp.linear_fc2.weight",
    "mlp.router.weight",
    "mlp.router.expert_bias",
    "mlp.shared_experts.linear_fc1.weight",
    "mlp.shared_experts.linear_fc2.weight",
    "mlp.shared_experts.gate_weight",
)
LAYER_GROUPS = (NORMS, ATTENTION, MLA, ROW_SPLIT, GATED_DELTA_NET, MLP)
EXPERT_NAMES = ("linear_fc1.weight", "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias")
MTP_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight")
TOP_LEVEL = (
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "decoder.final_layernorm.weight",
)
UNKNOWN_PARTS = ("vision_tower", "adapter", "proj", "blocks", "norm", "weight", "bias", "scale")


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    n = draw(st.integers(1, 6))
    experts = draw(st.sampled_from((0, 1, 4, 7)))
    layers = st.frozensets(st.integers(0, n - 1))
    row_parts = draw(
        st.one_of(
            st.just({}),
            st.builds(
                gated_delta_net_row_parts, st.integers(1, 64), st.integers(1, 64), st.integers(1, 8)
            ),
        )
    )
    return Layout(
        num_layers=n,
        num_experts=experts,
        stacked=draw(st.booleans()),
        glu=draw(st.booleans()),
        norms=draw(st.sampled_from(NormSpec)),
        linear_layers=draw(layers),
        moe_layers=draw(layers) if experts else frozenset(),
        row_parts=row_parts,
    )


def layer_names(layout: Layout) -> st.SearchStrategy[str]:
    """Names relative to a transformer layer, each group as likely as the others."""
    own = [st.sampled_from(group) for group in LAYER_GROUPS]
    if not layout.num_experts:
        return st.one_of(own)
    expert = st.builds(
        "mlp.experts.local_experts.{}.{}".format,
        st.integers(0, layout.num_experts - 1),
        st.sampled_from(EXPERT_NAMES),
    )
    return st.one_of(*own, expert)


def canonical_names(layout: Layout) -> st.SearchStrategy[str]:
    """Canonical names of a model of ``layout``, and names the scheme passes through."""
    decoder = st.builds(
        "decoder.layers.{}.{}".format, st.integers(0, layout.num_layers - 1), layer_names(layout)
    )
    mtp = st.builds(
        "mtp.layers.{}.{}".format,
        st.integers(0, 3),
        st.one_of(st.sampled_from(MTP_OWN), layer_names(layout).map("transformer_layer.{}".format)),
    )
    unknown = st.lists(st.sampled_from(UNKNOWN_PARTS), min_size=1, max_size=4).map(".".join)
    return st.one_of(decoder, mtp, st.sampled_from(TOP_LEVEL), unknown)


def stored(placement: Placement) -> list[tuple[str, tuple[int, ...], str | None]]:
    """The (key, prepended-axis indices, row part) of every piece a placement stores."""
    indices = tuple(offset for _, offset, _ in placement.offsets)
    if not placement.row_parts:
        return [(placement.key, indices, None)]
    return [(f"{placement.key}.{part}", indices, part) for part, _ in placement.row_parts]


@PROPERTY
@given(st.data())
def test_reading_back_a_written_key_gives_the_name(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    name = data.draw(canonical_names(layout))
    assert canonical_name(name) == name
    placement = to_sharded_key(name, layout)
    axes = [axis for axis, _, _ in placement.offsets]
    assert axes == list(range(len(axes)))  # layer axis first, then the expert axis
    fc1 = name.endswith(("linear_fc1.weight", "linear_fc1.bias"))
    assert placement.glu_fc1 == (layout.glu and fc1)  # [gate; up] fragments, one key
    for key, indices, part in stored(placement):
        assert from_sharded_key(key, indices) == (name, part)
        template = KeyTemplate.of(key, len(indices) + 2)  # + the tensor's own dimensions
        assert template.axes == len(indices)
        assert template.name(indices) == (name, part)
    if placement.row_parts:
        parts = [part for part, _ in placement.row_parts]
        assert tuple(parts) == row_part_order(set(parts))


@PROPERTY
@given(st.data())
def test_mtp_model_layer_is_written_as_transformer_layer(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    i, rest = data.draw(st.integers(0, 3)), data.draw(layer_names(layout))
    name = f"mtp.layers.{i}.transformer_layer.{rest}"
    spelled = f"mtp.layers.{i}.mtp_model_layer.{rest}"
    assert canonical_name(spelled) == name
    assert to_sharded_key(spelled, layout) == to_sharded_key(name, layout)


@PROPERTY
@given(st.data())
def test_no_two_names_share_a_stored_key(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    names = data.draw(st.lists(canonical_names(layout), min_size=2, max_size=40, unique=True))
    pieces = [piece for name in names for piece in stored(to_sharded_key(name, layout))]
    assert len(set(pieces)) == len(pieces)
    keys = [(key, indices) for key, indices, _ in pieces]
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("family", ["glm4_moe", "mimo", "deepseek_v3", "glm_moe_dsa", "qwen3_next"])
def test_every_tensor_of_a_family_reads_back(family: str) -> None:
    """The layouts of the built-in converter's families, with the names their models hold
    (Transformer Engine names spelled canonically first, as the converter passes them)."""
    from mtpcheck.convert import megatron_config as mc
    from mtpcheck.convert import megatron_names as mn

    hf = json.loads((FIXTURES / family / "config.json").read_text())
    layout = mc.torch_dist_layout(mc.transformer_config_kwargs(hf, family))
    names = {canonical_name(n) for n in mn.expected_model_names(family, hf)}
    pieces = []
    for name in names:
        for key, indices, part in stored(to_sharded_key(name, layout)):
            assert from_sharded_key(key, indices) == (name, part)
            pieces.append((key, indices))
    assert len(set(pieces)) == len(pieces)


# --- exact keys -----------------------------------------------------------------------------

GDN = Layout(
    num_layers=4,
    num_experts=8,
    glu=True,
    norms=NormSpec.TE_GATED_DELTA_NET,
    linear_layers=frozenset({0, 1, 2}),
    moe_layers=frozenset({1, 2, 3}),
    row_parts=gated_delta_net_row_parts(qk_rows=8, v_rows=16, v_heads=2),
)


@pytest.mark.parametrize(
    ("name", "layout", "expected"),
    [
        (
            "decoder.layers.3.input_layernorm.weight",
            Layout(num_layers=6, stacked=True),
            Placement(
                "decoder.layers.self_attention.linear_qkv.layer_norm_weight", ((0, 3, 6),), False
            ),
        ),
        (
            "decoder.layers.3.pre_mlp_layernorm.bias",
            Layout(num_layers=4),
            Placement("decoder.layers.3.mlp.linear_fc1.layer_norm_bias", (), False),
        ),
        (
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight",
            Layout(num_layers=2, num_experts=4, glu=True),
            Placement("decoder.layers.1.mlp.experts.experts.linear_fc1.weight", ((0, 2, 4),), True),
        ),
        (
            "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight",
            Layout(num_layers=2, num_experts=4, stacked=True, glu=True),
            Placement(
                "decoder.layers.mlp.experts.experts.linear_fc2.weight",
                ((0, 1, 2), (1, 2, 4)),
                False,
            ),
        ),
        (
            "decoder.layers.0.mlp.linear_fc1.weight",
            Layout(num_layers=2, glu=False),
            Placement("decoder.layers.0.mlp.linear_fc1.weight", (), False),
        ),
        (
            "decoder.layers.0.input_layernorm.weight",
            Layout(num_layers=2, norms=NormSpec.UNFUSED),
            Placement("decoder.layers.0.input_layernorm.weight", (), False),
        ),
        (
            "decoder.layers.0.input_layernorm.weight",
            Layout(num_layers=2, norms=NormSpec.TE_DSA),
            Placement("decoder.layers.0.input_layernorm.weight", (), False),
        ),
        (
            "decoder.layers.0.pre_mlp_layernorm.weight",
            Layout(num_layers=2, norms=NormSpec.TE_DSA, moe_layers=frozenset({1})),
            Placement("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", (), False),
        ),
        (
            "decoder.layers.0.input_layernorm.weight",
            GDN,
            Placement("decoder.layers.0.self_attention.in_proj.layer_norm_weight", (), False),
        ),
        (
            "decoder.layers.3.input_layernorm.weight",
            GDN,
            Placement("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight", (), False),
        ),
        (
            "decoder.layers.3.pre_mlp_layernorm.weight",
            GDN,
            Placement("decoder.layers.3.pre_mlp_layernorm.weight", (), False),
        ),
        (
            "decoder.layers.0.pre_mlp_layernorm.weight",
            GDN,
            Placement("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", (), False),
        ),
        (
            "decoder.layers.0.self_attention.in_proj.weight",
            GDN,
            Placement(
                "decoder.layers.0.self_attention.in_proj.weight",
                (),
                False,
                (("query", 8), ("key", 8), ("value", 16), ("z", 16), ("beta", 2), ("alpha", 2)),
            ),
        ),
        (
            "decoder.layers.2.self_attention.conv1d.weight",
            GDN,
            Placement(
                "decoder.layers.2.self_attention.conv1d.weight",
                (),
                False,
                (("query", 8), ("key", 8), ("value", 16)),
            ),
        ),
        (  # the MTP layer is built like the last decoder layer (full attention, MoE)
            "mtp.layers.0.mtp_model_layer.input_layernorm.weight",
            GDN,
            Placement(
                "mtp.layers.0.transformer_layer.self_attention.linear_qkv.layer_norm_weight",
                (),
                False,
            ),
        ),
        (
            "mtp.layers.0.transformer_layer.mlp.shared_experts.linear_fc1.weight",
            GDN,
            Placement(
                "mtp.layers.0.transformer_layer.mlp.shared_experts.linear_fc1.weight", (), True
            ),
        ),
        (
            "mtp.layers.1.eh_proj.weight",
            Layout(num_layers=2, stacked=True, glu=True),
            Placement("mtp.layers.1.eh_proj.weight", (), False),
        ),
        (
            "embedding.word_embeddings.weight",
            Layout(num_layers=2, stacked=True),
            Placement("embedding.word_embeddings.weight", (), False),
        ),
    ],
)
def test_exact_keys(name: str, layout: Layout, expected: Placement) -> None:
    assert to_sharded_key(name, layout) == expected


@pytest.mark.parametrize(
    ("key", "indices", "expected"),
    [
        (  # singleton-shard saves: SwiGLU halves under their own keys, expert index kept
            "decoder.layers.1.mlp.experts.experts.3.linear_fc1.weight_w",
            (),
            ("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight", "w"),
        ),
        (
            "mtp.layers.0.mtp_model_layer.mlp.linear_fc1.bias_v",
            (),
            ("mtp.layers.0.transformer_layer.mlp.linear_fc1.bias", "v"),
        ),
        (
            "decoder.layers.mlp.experts.experts.linear_fc1.weight",
            (5, 7),
            ("decoder.layers.5.mlp.experts.local_experts.7.linear_fc1.weight", None),
        ),
        (
            "decoder.layers.2.self_attention.in_proj.weight.alpha",
            (),
            ("decoder.layers.2.self_attention.in_proj.weight", "alpha"),
        ),
        (  # only in_proj and conv1d are split by ``.weight.<part>``
            "decoder.layers.2.self_attention.linear_proj.weight.query",
            (),
            ("decoder.layers.2.self_attention.linear_proj.weight.query", None),
        ),
        (
            "decoder.layers.2.self_attention.conv1d.weight.z",
            (),
            ("decoder.layers.2.self_attention.conv1d.weight.z", None),
        ),
        (  # a TE-spec MoE layer's own pre-MLP norm
            "decoder.layers.0.pre_mlp_layernorm.weight",
            (),
            ("decoder.layers.0.pre_mlp_layernorm.weight", None),
        ),
    ],
)
def test_exact_names(key: str, indices: tuple[int, ...], expected: tuple[str, str | None]) -> None:
    assert from_sharded_key(key, indices) == expected


def test_row_parts_have_one_order_each() -> None:
    assert row_part_order({"v", "w"}) == ("w", "v")
    assert row_part_order(["value", "query", "key"]) == ("query", "key", "value")
    assert row_part_order(set(ROW_PARTS["in_proj"])) == ROW_PARTS["in_proj"]
    assert row_part_order({"query", "key"}) is None
    assert row_part_order({"w", "query"}) is None
    assert split_row_part("x.linear_fc1.weight") == ("x.linear_fc1.weight", None)
    parts = gated_delta_net_row_parts(qk_rows=3, v_rows=5, v_heads=1)
    assert {m: tuple(p for p, _ in rows) for m, rows in parts.items()} == {
        "self_attention.in_proj.weight": ROW_PARTS["in_proj"],
        "self_attention.conv1d.weight": ROW_PARTS["conv1d"],
    }


def test_mamba_row_parts_and_names() -> None:
    """megatron-core's MambaMixer stores ``in_proj.weight`` as z, x, B, C, dt and ``conv1d``'s
    weight and bias as x, B, C (Nemotron-H by Megatron-Bridge 0.6); its fused norm and the
    hybrid stack's final norm read back under GPT's canonical names."""
    assert row_part_order({"dt", "C", "B", "x", "z"}) == ("z", "x", "B", "C", "dt")
    assert row_part_order({"C", "x", "B"}) == ("x", "B", "C")
    assert row_part_order({"x", "B"}) is None
    layer = "decoder.layers.0.mixer."
    assert split_row_part(layer + "in_proj.weight.dt") == (layer + "in_proj.weight", "dt")
    assert split_row_part(layer + "conv1d.bias.B") == (layer + "conv1d.bias", "B")
    assert split_row_part(layer + "in_proj.bias.x") == (layer + "in_proj.bias.x", None)
    assert split_row_part(layer + "out_proj.weight.x") == (layer + "out_proj.weight.x", None)
    assert canonical_name(layer + "in_proj.layer_norm_weight") == "decoder.layers.0.norm.weight"
    assert canonical_name("decoder.final_norm.weight") == "decoder.final_layernorm.weight"


def test_norm_renames_are_one_table() -> None:
    """Every fused norm the writer can write is undone by the readers, in any layer."""
    for fused in FUSED_NORMS:
        for prefix in ("decoder.layers.4.", "mtp.layers.0.transformer_layer."):
            for kind in ("weight", "bias"):
                assert (
                    canonical_name(f"{prefix}{fused.fused}{kind}") == f"{prefix}{fused.norm}{kind}"
                )


def test_out_of_range_and_mismatched_indices_are_refused() -> None:
    layout = Layout(num_layers=2, num_experts=4)
    with pytest.raises(ValueError, match="layer 2 outside num_layers=2"):
        to_sharded_key("decoder.layers.2.input_layernorm.weight", layout)
    with pytest.raises(ValueError, match="expert 4 outside num_moe_experts=4"):
        to_sharded_key("decoder.layers.1.mlp.experts.local_experts.4.linear_fc1.weight", layout)
    with pytest.raises(ValueError, match="has 1 prepended axes"):
        from_sharded_key("decoder.layers.input_layernorm.weight")


def test_a_tensor_without_room_for_its_axes_keeps_its_key() -> None:
    """Where the key asks for more prepended axes than the tensor has dimensions, the reader
    takes the key as it is."""
    template = KeyTemplate.of("decoder.layers.mlp.experts.experts.linear_fc1.weight", 1)
    assert template.axes == 0
    assert template.name(()) == ("decoder.layers.mlp.experts.experts.linear_fc1.weight", None)
    assert KeyTemplate.of("decoder.layers.mlp.experts.experts.linear_fc1.weight", 2).axes == 2
