"""HF <-> Megatron mapping: exact layouts, exact inverses, nothing dropped silently."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpcheck.checks.tensor_match import compare
from mtpcheck.formats import open_checkpoint
from mtpcheck.mapping import MappingError, as_hf, as_megatron, build_plan
from mtpcheck.mapping.transforms import (
    Gdn,
    Qkv,
    head_grouped_from_megatron,
    head_grouped_pieces,
    head_grouped_to_megatron,
    qkv_from_megatron,
    qkv_to_megatron,
    swap_column_halves,
)
from mtpcheck.mapping.views import load_array
from mtpcheck.model import TensorStatus
from tests.conftest import FIXTURES

MAPPED = ("deepseek_v3", "glm4_moe", "mimo", "qwen3_next", "qwen3_5_text")


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(1, 4),
    heads_per_group=st.integers(1, 4),
    head_dim=st.integers(1, 6),
    width=st.integers(0, 5),
    gated=st.booleans(),
    per_head=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_qkv_round_trip_is_exact(
    groups, heads_per_group, head_dim, width, gated, per_head, seed
) -> None:
    rng = np.random.default_rng(seed)
    q = Qkv(groups * heads_per_group, groups, head_dim, gated, gate_per_head=per_head)
    tail = (width,) if width else ()
    wq = rng.integers(0, 2**16, (q.num_heads * head_dim * (2 if gated else 1), *tail), np.uint16)
    wk = rng.integers(0, 2**16, (groups * head_dim, *tail), np.uint16)
    wv = rng.integers(0, 2**16, (groups * head_dim, *tail), np.uint16)
    merged = qkv_to_megatron(q, wq, wk, wv)
    back = qkv_from_megatron(q, merged)
    assert all(np.array_equal(a, b) for a, b in zip(back, (wq, wk, wv), strict=True))


def test_qkv_layout_is_megatron_grouped_order() -> None:
    q = Qkv(num_heads=4, num_groups=2, head_dim=1)
    rows = np.arange(8, dtype=np.uint8)
    merged = qkv_to_megatron(q, rows[:4], rows[4:6], rows[6:8])
    # group 0: q heads 0,1, k0, v0; group 1: q heads 2,3, k1, v1
    assert merged.tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    gated = Qkv(num_heads=2, num_groups=1, head_dim=1, gated=True)
    # HF q_proj per head: [q, gate]; Megatron per group: [q heads, gate heads, k, v]
    merged = qkv_to_megatron(
        gated, np.array([10, 11, 20, 21], np.uint8), np.array([5]), np.array([6])
    )
    assert merged.tolist() == [10, 20, 11, 21, 5, 6]
    # mcore-bridge's GatedSelfAttention keeps each head's [q, gate] together
    swift = Qkv(num_heads=2, num_groups=1, head_dim=1, gated=True, gate_per_head=True)
    merged = qkv_to_megatron(
        swift, np.array([10, 11, 20, 21], np.uint8), np.array([5]), np.array([6])
    )
    assert merged.tolist() == [10, 11, 20, 21, 5, 6]


@pytest.mark.parametrize(
    "hf", [("linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"),
           tuple(f"linear_attn.in_proj_{p}.weight" for p in ("qkv", "z", "b", "a")),
           ("linear_attn.conv1d.weight",)],
)  # fmt: skip
def test_head_grouped_gated_delta_net_layout(hf: tuple[str, ...]) -> None:
    """mcore-bridge's gated delta net: each HF tensor's flat pieces, regrouped key head by key
    head; exactly invertible. Row labels show the order for 2 key heads."""
    g = Gdn(key_heads=2, key_dim=1, value_heads=4, value_dim=1)
    pieces = head_grouped_pieces(g, hf)
    parts, label = [], 0
    for sizes in pieces:
        rows = np.arange(label, label + sum(sizes), dtype=np.uint16)
        parts.append(rows)
        label += sum(sizes)
    merged = head_grouped_to_megatron(g, pieces, parts)
    back = head_grouped_from_megatron(g, pieces, merged)
    assert all(np.array_equal(a, b) for a, b in zip(back, parts, strict=True))
    flat = [
        p
        for part, sizes in zip(parts, pieces, strict=True)
        for p in np.split(part, np.cumsum(sizes)[:-1])
    ]
    expected = [int(x) for h in range(2) for p in flat for x in p.reshape(2, -1)[h]]
    assert merged.tolist() == expected


def test_swap_halves_is_an_involution() -> None:
    w = np.arange(12, dtype=np.uint16).reshape(2, 6)
    assert swap_column_halves(w).tolist() == [[3, 4, 5, 0, 1, 2], [9, 10, 11, 6, 7, 8]]
    assert np.array_equal(swap_column_halves(swap_column_halves(w)), w)


@pytest.mark.parametrize("name", MAPPED)
def test_fixture_maps_completely_and_back_bit_for_bit(name: str) -> None:
    hf = open_checkpoint(FIXTURES / name)
    plan = build_plan(hf.config, hf.tensors, "hf")
    assert plan.unmapped == ()
    meg = as_megatron(hf)
    assert any(n.startswith("mtp.layers.0.transformer_layer.") for n in meg.tensors)
    back = as_hf(meg, hf.config)
    assert set(back.tensors) == set(hf.tensors)
    for n in hf.tensors:
        assert compare(hf, n, back, n).status is TensorStatus.EQUAL, n


def test_qwen3_5_gated_delta_net_projections_stack_as_megatron_core_fuses_them() -> None:
    """Qwen3.5's four projections become ``[q; k; v; z; beta; alpha]`` rows, each part whole
    (megatron-core's fused ``in_proj``; Megatron-Bridge 0.6 GDNLinearMappingSeparate at TP 1)."""
    hf = open_checkpoint(FIXTURES / "qwen3_5_text")
    meg = as_megatron(hf)
    name = "decoder.layers.0.self_attention.in_proj.weight"
    whole = load_array(meg, name)
    parts = [load_array(hf, f"model.layers.0.linear_attn.in_proj_{p}.weight")
             for p in ("qkv", "z", "b", "a")]  # fmt: skip
    assert [p.shape[0] for p in parts] == [64, 32, 4, 4]  # 2 * 2 key heads * 8 + 4 * 8, ...
    assert np.array_equal(whole, np.concatenate(parts))
    assert "decoder.layers.3.self_attention.in_proj.weight" not in meg.tensors  # full attention


def test_megatron_names_of_the_glm_mtp_layer() -> None:
    meg = as_megatron(open_checkpoint(FIXTURES / "glm4_moe"))
    mtp = sorted(n for n in meg.tensors if n.startswith("mtp.layers.0."))
    assert mtp[:4] == [
        "mtp.layers.0.eh_proj.weight",
        "mtp.layers.0.enorm.weight",
        "mtp.layers.0.final_layernorm.weight",
        "mtp.layers.0.hnorm.weight",
    ]
    inner = {n.removeprefix("mtp.layers.0.transformer_layer.") for n in mtp[4:]}
    assert {
        "input_layernorm.weight",
        "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias",
        "self_attention.q_layernorm.weight",
        "self_attention.k_layernorm.weight",
        "self_attention.linear_proj.weight",
        "pre_mlp_layernorm.weight",
        "mlp.router.weight",
        "mlp.router.expert_bias",
        "mlp.experts.local_experts.3.linear_fc1.weight",
        "mlp.shared_experts.linear_fc2.weight",
    } <= inner
    assert meg.tensors["mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight"].shape == (
        32,
        16,
    )


def test_mimo_projection_halves_are_swapped_for_megatron() -> None:
    hf = open_checkpoint(FIXTURES / "mimo")
    meg = as_megatron(hf)
    ours = load_array(meg, "mtp.layers.0.eh_proj.weight")
    theirs = load_array(hf, "model.mtp_layers.0.input_proj.weight")
    assert np.array_equal(ours, swap_column_halves(theirs))
    assert not np.array_equal(ours, theirs)


def test_fc1_is_gate_then_up() -> None:
    hf = open_checkpoint(FIXTURES / "mimo")
    fc1 = load_array(as_megatron(hf), "decoder.layers.1.mlp.linear_fc1.weight")
    gate = load_array(hf, "model.layers.1.mlp.gate_proj.weight")
    up = load_array(hf, "model.layers.1.mlp.up_proj.weight")
    assert np.array_equal(fc1, np.concatenate([gate, up]))


def test_shared_copies_are_recreated_from_the_main_tensors() -> None:
    hf = open_checkpoint(FIXTURES / "deepseek_v3")
    meg = as_megatron(hf)
    assert not any("embed_tokens" in n or "shared_head.head" in n for n in meg.tensors)
    back = as_hf(meg, hf.config, with_copies=False)
    assert "model.layers.2.embed_tokens.weight" not in back.tensors
    full = as_hf(meg, hf.config)
    c = compare(
        hf, "model.layers.2.shared_head.head.weight", full, "model.layers.2.shared_head.head.weight"
    )
    assert c.status is TensorStatus.EQUAL


def test_unmappable_tensors_are_listed_not_dropped() -> None:
    hf = open_checkpoint(FIXTURES / "qwen3_next")
    assert build_plan(hf.config, hf.tensors, "hf").unmapped == ()
    stray = "model.layers.0.linear_attn.mystery.weight"
    plan = build_plan(hf.config, [*hf.tensors, stray], "hf")
    assert plan.unmapped == (stray,)


def test_family_without_mapping_is_refused() -> None:
    with pytest.raises(MappingError, match="no HF <-> Megatron mapping for LongCat-Flash"):
        build_plan({"model_type": "longcat_flash", "num_hidden_layers": 2}, [], "hf")
    with pytest.raises(MappingError, match="not a known MTP family"):
        build_plan({"model_type": "llama"}, [], "hf")


def test_zero_centred_norm_is_computed_as_torch_computes_it() -> None:
    """``w - 1`` and back, bit for bit what torch's in-place add gives on the same dtype
    (Megatron-Bridge's RMSNorm2ZeroCenteredRMSNormMapping runs exactly that)."""
    import torch

    from mtpcheck.mapping.transforms import add_to_values

    values = [0.251953125, 0.5, 0.7, 1.0, 1.3, 255.0, 300.0, -2.5, 0.0, -0.0, 1e-8]
    for dtype, torch_dtype, bits in (
        ("BF16", torch.bfloat16, torch.int16),
        ("F16", torch.float16, torch.int16),
        ("F32", torch.float32, torch.int32),
    ):
        t = torch.tensor(values, dtype=torch_dtype)
        raw = t.view(bits).numpy().view(f"<u{t.element_size()}")
        for delta in (-1.0, 1.0):
            expected = (t + delta).view(bits).numpy().view(raw.dtype)
            assert np.array_equal(add_to_values(raw, dtype, delta), expected), (dtype, delta)
    nan = torch.tensor([float("nan")], dtype=torch.bfloat16).view(torch.int16).numpy()
    back = add_to_values(nan.view("<u2"), "BF16", -1.0).view(np.uint16)
    assert (int(back[0]) & 0x7F80) == 0x7F80 and int(back[0]) & 0x007F  # still a NaN
    with pytest.raises(ValueError, match="F8_E4M3"):
        add_to_values(np.zeros(2, dtype=np.uint8), "F8_E4M3", -1.0)
