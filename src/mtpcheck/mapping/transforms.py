"""Tensor transforms between HF and Megatron layouts, over raw element bits.

Arrays hold unsigned integers of the element width (uint16 for BF16, uint8 for FP8, ...).
Every transform but one is pure slicing and concatenation, so no value is converted and a
correct round trip reproduces every byte. The exception is :func:`add_to_values`, for a norm
one side stores zero-centred (Megatron's ``out_norm`` of a gated delta net): ``w - 1`` and
back, computed as torch computes it on a tensor of that dtype, which gives every value back
unchanged only where ``w - 1`` is representable (for BF16 weights in [0.5, 256)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mtpcheck.dtypes import DTYPES, code_values, top_bits_of


@dataclass(frozen=True)
class Qkv:
    """Grouped-query layout parameters: Megatron stores ``[q_g, (gate_g), k_g, v_g]`` per group."""

    num_heads: int
    num_groups: int
    head_dim: int
    gated: bool = False
    """Qwen3-Next: HF q_proj holds ``[q; gate]`` per head; Megatron adds gate rows per group."""
    gate_per_head: bool = False
    """With ``gated``: Megatron keeps each head's ``[q; gate]`` together, ``[q_h0; gate_h0;
    q_h1; ...; k_g; v_g]`` per group (mcore-bridge's ``GatedSelfAttention``), not
    ``[q_g; gate_g; k_g; v_g]`` (megatron-core's)."""


def concat_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """HF tensors fused into one by rows (Megatron's ``linear_fc1`` of gate and up)."""
    return np.concatenate(parts, axis=0)


def split_rows(whole: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """A fused tensor cut by rows into parts of ``sizes`` rows (the inverse of
    :func:`concat_rows`); ``ValueError`` when they do not add up."""
    if sum(sizes) != whole.shape[0]:
        raise ValueError(f"cannot split {whole.shape[0]} rows into {list(sizes)}")
    bounds = np.cumsum([0, *sizes])
    return [whole[bounds[j] : bounds[j + 1]] for j in range(len(sizes))]


def stack(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Per-expert tensors stacked along a new first axis (packed experts)."""
    return np.stack(parts, axis=0)


def unstack(whole: np.ndarray) -> list[np.ndarray]:
    """A stacked tensor's entries along its first axis (the inverse of :func:`stack`)."""
    return [whole[j] for j in range(whole.shape[0])]


def swap_column_halves(w: np.ndarray) -> np.ndarray:
    """``[A | B] -> [B | A]`` along the last axis; its own inverse."""
    half = w.shape[-1] // 2
    if w.shape[-1] != 2 * half:
        raise ValueError(f"projection has an odd input width {w.shape[-1]}")
    return np.concatenate([w[..., half:], w[..., :half]], axis=-1)


def _per_group(q: Qkv, x: np.ndarray, per_group: int) -> np.ndarray:
    return x.reshape((q.num_groups, per_group * q.head_dim, *x.shape[1:]))


def qkv_to_megatron(q: Qkv, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray) -> np.ndarray:
    """HF q/k/v (weights or biases) -> Megatron grouped ``linear_qkv``."""
    heads_per_group = q.num_heads // q.num_groups
    d = q.head_dim
    tail = wq.shape[1:]
    if q.gated and q.gate_per_head:
        blocks = [wq.reshape((q.num_groups, heads_per_group * 2 * d, *tail))]
    elif q.gated:
        both = wq.reshape((q.num_heads, 2, d, *tail))
        query = both[:, 0].reshape((q.num_groups, heads_per_group * d, *tail))
        gate = both[:, 1].reshape((q.num_groups, heads_per_group * d, *tail))
        blocks = [query, gate]
    else:
        blocks = [_per_group(q, wq, heads_per_group)]
    blocks += [_per_group(q, wk, 1), _per_group(q, wv, 1)]
    merged = np.concatenate(blocks, axis=1)
    return merged.reshape((-1, *tail))


def qkv_from_megatron(q: Qkv, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Megatron grouped ``linear_qkv`` -> HF q, k, v (inverse of :func:`qkv_to_megatron`)."""
    heads_per_group = q.num_heads // q.num_groups
    d = q.head_dim
    tail = w.shape[1:]
    q_rows = heads_per_group * d * (2 if q.gated else 1)
    grouped = w.reshape((q.num_groups, q_rows + 2 * d, *tail))
    query = grouped[:, :q_rows]
    k = grouped[:, q_rows : q_rows + d].reshape((-1, *tail))
    v = grouped[:, q_rows + d :].reshape((-1, *tail))
    if q.gated and q.gate_per_head:
        pass  # each head's [q; gate] is already in HF's order
    elif q.gated:
        qq = query[:, : heads_per_group * d].reshape((q.num_heads, 1, d, *tail))
        gate = query[:, heads_per_group * d :].reshape((q.num_heads, 1, d, *tail))
        query = np.concatenate([qq, gate], axis=1)
    return query.reshape((-1, *tail)), k, v


@dataclass(frozen=True)
class Gdn:
    """Gated-delta-net head layout (Qwen3-Next ``linear_attn``).

    HF stores the input projection as two tensors grouped by key head: ``in_proj_qkvz`` rows are
    ``[q_h, k_h, v_h, z_h]`` for each key head ``h`` (``v`` and ``z`` hold the value heads of
    that group), ``in_proj_ba`` rows are ``[b_h, a_h]``. megatron-core's fused ``in_proj`` is
    ``[q; k; v; z; beta; alpha]``, each part head-major over all heads.
    """

    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int

    @property
    def ratio(self) -> int:
        """Value heads per key head."""
        return self.value_heads // self.key_heads

    def qkvz_widths(self) -> tuple[int, int, int, int]:
        """Rows of q, k, v, z per key head."""
        vz = self.ratio * self.value_dim
        return self.key_dim, self.key_dim, vz, vz

    def rows(self) -> tuple[int, int]:
        """Rows of HF ``in_proj_qkvz`` and ``in_proj_ba``."""
        return self.key_heads * sum(self.qkvz_widths()), 2 * self.value_heads

    def split_rows(self) -> tuple[int, int, int, int]:
        """Rows of Qwen3.5's HF ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``."""
        k, v = self.key_heads * self.key_dim, self.value_heads * self.value_dim
        return 2 * k + v, v, self.value_heads, self.value_heads


def _by_key_head(g: Gdn, x: np.ndarray, widths: Sequence[int]) -> list[np.ndarray]:
    grouped = x.reshape((g.key_heads, sum(widths), *x.shape[1:]))
    bounds = np.cumsum([0, *widths])
    return [
        grouped[:, bounds[j] : bounds[j + 1]].reshape((-1, *x.shape[1:]))
        for j in range(len(widths))
    ]


def gdn_in_proj_to_megatron(g: Gdn, qkvz: np.ndarray, ba: np.ndarray) -> np.ndarray:
    """HF ``in_proj_qkvz`` + ``in_proj_ba`` -> megatron-core's fused ``in_proj``."""
    parts = _by_key_head(g, qkvz, g.qkvz_widths())
    parts += _by_key_head(g, ba, (g.ratio, g.ratio))
    return np.concatenate(parts, axis=0)


def gdn_in_proj_from_megatron(g: Gdn, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`gdn_in_proj_to_megatron`."""
    tail = w.shape[1:]
    widths = (*g.qkvz_widths(), g.ratio, g.ratio)
    sizes = [g.key_heads * width for width in widths]
    pieces = split_rows(w, sizes)
    per_head = [
        p.reshape((g.key_heads, width, *tail)) for p, width in zip(pieces, widths, strict=True)
    ]
    qkvz = np.concatenate(per_head[:4], axis=1).reshape((-1, *tail))
    ba = np.concatenate(per_head[4:], axis=1).reshape((-1, *tail))
    return qkvz, ba


def head_grouped_pieces(g: Gdn, hf: Sequence[str]) -> list[list[int]]:
    """Row counts of the flat pieces each HF tensor of a gated delta net holds, in order, for
    the key-head-grouped layout (:func:`head_grouped_to_megatron`): ``in_proj_qkvz`` and
    ``in_proj_ba`` are grouped already (one piece each), Qwen3.5's ``in_proj_qkv`` and the
    ``conv1d`` weight are flat ``[q; k; v]`` (three), ``in_proj_z`` / ``_b`` / ``_a`` one each."""
    k, v = g.key_heads * g.key_dim, g.value_heads * g.value_dim
    qkvz, ba = g.rows()
    known = {
        "in_proj_qkvz.weight": [qkvz],
        "in_proj_ba.weight": [ba],
        "in_proj_qkv.weight": [k, k, v],
        "conv1d.weight": [k, k, v],
        "in_proj_z.weight": [v],
        "in_proj_b.weight": [g.value_heads],
        "in_proj_a.weight": [g.value_heads],
    }
    return [known[name.rsplit(".", 2)[-2] + ".weight"] for name in hf]


def head_grouped_to_megatron(
    g: Gdn, pieces: Sequence[Sequence[int]], parts: Sequence[np.ndarray]
) -> np.ndarray:
    """HF gated-delta-net tensors -> mcore-bridge's layout: every flat piece cut into its
    ``key_heads`` groups of rows, then the pieces concatenated key head by key head
    (``[q_h; k_h; v_h; z_h; b_h; a_h]`` for each head ``h``; ``conv1d``: ``[q_h; k_h; v_h]``)."""
    flat = [p for part, sizes in zip(parts, pieces, strict=True) for p in split_rows(part, sizes)]
    tail = parts[0].shape[1:]
    grouped = [p.reshape((g.key_heads, -1, *tail)) for p in flat]
    return np.concatenate(grouped, axis=1).reshape((-1, *tail))


def head_grouped_from_megatron(
    g: Gdn, pieces: Sequence[Sequence[int]], whole: np.ndarray
) -> list[np.ndarray]:
    """Inverse of :func:`head_grouped_to_megatron`: the HF tensors, in order."""
    tail = whole.shape[1:]
    sizes = [size for part in pieces for size in part]
    if sum(sizes) != whole.shape[0] or any(size % g.key_heads for size in sizes):
        raise ValueError(f"{whole.shape[0]} rows do not split into {sizes} by key head")
    per_head = whole.reshape((g.key_heads, -1, *tail))
    bounds = np.cumsum([0, *(size // g.key_heads for size in sizes)])
    flat = [per_head[:, bounds[j] : bounds[j + 1]].reshape((-1, *tail)) for j in range(len(sizes))]
    out, at = [], 0
    for part in pieces:
        out.append(np.concatenate(flat[at : at + len(part)], axis=0))
        at += len(part)
    return out


def add_to_values(bits: np.ndarray, dtype: str, delta: float) -> np.ndarray:
    """The bits of every element's value plus ``delta``, rounded as torch's in-place add on a
    tensor of ``dtype`` rounds it: the sum in float32 (float64 for F32), then to nearest even
    in ``dtype``; NaN stays NaN."""
    if dtype == "BF16":
        values = decode(bits, dtype, "<f4")
        summed = (values + np.float32(delta)).astype(np.float32)
        raw = summed.view(np.uint32)
        rounded = (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16
        quiet = (raw >> 16) | 0x0040
        out: np.ndarray = np.where(np.isnan(summed), quiet, rounded).astype(np.uint16)
        return out
    if dtype == "F16":
        half: np.ndarray = (decode(bits, dtype, "<f4") + np.float32(delta)).astype(np.float16)
        return half.view(np.uint16)
    if dtype == "F32":
        return (decode(bits, dtype) + delta).astype(np.float32).view(np.uint32)
    raise ValueError(f"a zero-centred norm of dtype {dtype} is not supported")


def decode(raw: np.ndarray, code: str, to: str = "<f8") -> np.ndarray:
    """The values of ``raw`` (unsigned ints of ``code``'s width) as numpy type ``to``: a type
    numpy holds viewed and cast, BF16 shifted to the top of a float32, a one-byte float looked
    up in :func:`~mtpcheck.dtypes.code_values`. Every cast keeps the value, the sign of a zero
    and (quieted) a NaN's payload; ``ValueError`` for a type none of these reads."""
    dtype = DTYPES[code]
    widened = top_bits_of(code)
    values: np.ndarray
    with np.errstate(invalid="ignore"):  # signalling NaNs: quiet ones after the cast
        if dtype.numpy is not None:
            values = raw.view(dtype.numpy).astype(to)
        elif dtype.layout is not None and dtype.bits <= 8:
            values = np.array(code_values(code))[raw].astype(to)
        elif widened is not None:
            wide, shift = DTYPES[widened[0]], widened[1]
            bits = raw.astype(f"<u{wide.bits // 8}") << shift
            values = bits.view(f"<f{wide.bits // 8}").astype(to, copy=False)  # bits is ours
        else:
            raise ValueError(f"{code} values are not decoded")
    return values


def widen(raw: np.ndarray, narrow: str, wide: str) -> np.ndarray:
    """Bits of ``raw`` (unsigned ints of ``narrow``'s width) as ``wide``'s bits, exactly."""
    width = DTYPES[wide].bits // 8
    return decode(raw, narrow, f"<f{width}").view(f"<u{width}")
