"""Present one checkpoint under the other side's names, bytes computed on demand.

``as_megatron(hf_checkpoint)`` shows an HF checkpoint as the Megatron checkpoint a correct
conversion would produce; ``as_hf(megatron_checkpoint, hf_config)`` the reverse. Both are
ordinary :class:`~mtpcheck.model.Checkpoint` objects, so the tensor matcher compares across
formats without knowing about them, and the built-in converter writes from them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import itemsize
from mtpcheck.errors import ConfigKeyError, InputError
from mtpcheck.layouts import MegatronLayout
from mtpcheck.mapping import transforms as tf
from mtpcheck.mapping.plan import MappingError, Plan, TensorMapping, build_plan
from mtpcheck.mapping.rules import Kind
from mtpcheck.model import Checkpoint, Naming, ReadsSlices, TensorMeta, ViewData, read_whole
from mtpcheck.model.config_keys import is_int, text_value
from mtpcheck.params import Role, logical_name, quantized_modules
from mtpcheck.units import first_few

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def load_array(ckpt: Checkpoint, name: str, chunk_bytes: int = 1 << 24) -> np.ndarray:
    """One tensor as an array of unsigned ints of its element width (bits, not values)."""
    meta = ckpt.tensors[name]
    width = itemsize(meta.dtype)
    if width is None:
        raise MappingError(f"{name}: sub-byte dtype {meta.dtype} cannot be re-laid out")
    buf = read_whole(ckpt, name, chunk_bytes)
    array = np.frombuffer(buf, dtype=_UINT[width]).reshape(meta.shape)
    array.flags.writeable = False  # the source's bits: transforms copy, never write
    return array


def _yield_bytes(array: np.ndarray, chunk_bytes: int) -> Iterator[bytes]:
    """The array's bytes in C order, ``chunk_bytes`` at a time (one empty chunk for an empty
    array): ``bytes``, which the tensor matcher compares with ``memcmp``."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    for start in range(0, len(raw), chunk_bytes):
        yield bytes(raw[start : start + chunk_bytes])
    if not len(raw):
        yield b""


def _same_dtype(metas: list[TensorMeta], what: str) -> str:
    dtypes = {m.dtype for m in metas}
    if len(dtypes) != 1:
        raise MappingError(f"{what}: sources have different dtypes {sorted(dtypes)}")
    return dtypes.pop()


_ONE_TO_ONE = (Kind.COPY, Kind.SWAP_HALVES, Kind.ZERO_CENTRED)


def _forward_shape(m: TensorMapping, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    if m.kind in _ONE_TO_ONE:
        return shapes[0]
    if m.kind is Kind.FUSED_EXPERT:
        if len(shapes[0]) != 3 or m.expert is None or m.expert >= shapes[0][0]:
            raise MappingError(f"{m.hf[0]}: shape {list(shapes[0])} holds no expert {m.expert}")
        return shapes[0][1:]
    tails = {s[1:] for s in shapes}
    if len(tails) != 1:
        raise MappingError(f"{m.megatron}: source shapes {shapes} cannot be stacked by rows")
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def _backward_shapes(m: TensorMapping, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    if m.kind in _ONE_TO_ONE:
        return [shape]
    tail = shape[1:]
    if m.kind is Kind.GDN_HEAD_GROUPED:
        assert m.gdn is not None
        rows = [sum(p) for p in tf.head_grouped_pieces(m.gdn, m.hf)]
        if shape[0] != sum(rows):
            raise MappingError(f"{m.megatron}: {shape[0]} rows do not match {m.gdn}")
        return [(r, *tail) for r in rows]
    if m.kind is Kind.GDN_IN_PROJ:
        assert m.gdn is not None
        qkvz, ba = m.gdn.rows()
        if shape[0] != qkvz + ba:
            raise MappingError(f"{m.megatron}: {shape[0]} rows do not match {m.gdn}")
        return [(qkvz, *tail), (ba, *tail)]
    if m.kind is Kind.GDN_SPLIT_IN_PROJ:
        assert m.gdn is not None
        split = m.gdn.split_rows()
        if shape[0] != sum(split):
            raise MappingError(f"{m.megatron}: {shape[0]} rows do not match {m.gdn}")
        return [(r, *tail) for r in split]
    if m.kind is Kind.CONCAT_ROWS:
        parts = len(m.hf)
        if shape[0] % parts:
            raise MappingError(f"{m.megatron}: {shape[0]} rows do not split in {parts}")
        return [(shape[0] // parts, *tail)] * parts
    assert m.qkv is not None
    q = m.qkv
    q_rows = q.num_heads * q.head_dim * (2 if q.gated else 1)
    kv_rows = q.num_groups * q.head_dim
    if shape[0] != q_rows + 2 * kv_rows:
        raise MappingError(f"{m.megatron}: {shape[0]} rows do not match the attention layout {q}")
    return [(q_rows, *tail), (kv_rows, *tail), (kv_rows, *tail)]


def forward(m: TensorMapping, parts: list[np.ndarray], dtype: str = "") -> np.ndarray:
    """HF arrays (of ``dtype``) -> the Megatron array."""
    if m.kind is Kind.COPY:
        return parts[0]
    if m.kind is Kind.ZERO_CENTRED:
        return tf.add_to_values(parts[0], dtype, -1.0)
    if m.kind is Kind.SWAP_HALVES:
        return tf.swap_column_halves(parts[0])
    if m.kind in (Kind.CONCAT_ROWS, Kind.GDN_SPLIT_IN_PROJ):
        return tf.concat_rows(parts)
    if m.kind is Kind.GDN_HEAD_GROUPED:
        assert m.gdn is not None
        return tf.head_grouped_to_megatron(m.gdn, tf.head_grouped_pieces(m.gdn, m.hf), parts)
    if m.kind is Kind.GDN_IN_PROJ:
        assert m.gdn is not None
        return tf.gdn_in_proj_to_megatron(m.gdn, *parts)
    assert m.qkv is not None
    return tf.qkv_to_megatron(m.qkv, *parts)


def backward(m: TensorMapping, whole: np.ndarray, dtype: str = "") -> list[np.ndarray]:
    """The Megatron array (of ``dtype``) -> HF arrays, in the order of ``m.hf``."""
    if m.kind is Kind.COPY:
        return [whole]
    if m.kind is Kind.ZERO_CENTRED:
        return [tf.add_to_values(whole, dtype, 1.0)]
    if m.kind is Kind.SWAP_HALVES:
        return [tf.swap_column_halves(whole)]
    if m.kind in (Kind.CONCAT_ROWS, Kind.GDN_SPLIT_IN_PROJ):
        return tf.split_rows(whole, [s[0] for s in _backward_shapes(m, whole.shape)])
    if m.kind is Kind.GDN_HEAD_GROUPED:
        assert m.gdn is not None
        _backward_shapes(m, whole.shape)  # validates the row count
        pieces = tf.head_grouped_pieces(m.gdn, m.hf)
        return tf.head_grouped_from_megatron(m.gdn, pieces, whole)
    if m.kind is Kind.GDN_IN_PROJ:
        assert m.gdn is not None
        _backward_shapes(m, whole.shape)  # validates the row count
        return list(tf.gdn_in_proj_from_megatron(m.gdn, whole))
    assert m.qkv is not None
    return list(tf.qkv_from_megatron(m.qkv, whole))


@dataclass(frozen=True)
class MappedCheckpoint(ViewData):
    """A checkpoint shown under the other side's names."""

    plan: Plan
    direction: str
    sources: Mapping[str, str] = field(default_factory=dict)
    """Name here -> name(s) it is computed from in ``source``, for messages."""

    @property
    def naming(self) -> Naming:
        """Megatron names for an HF source shown as Megatron, HF names the other way."""
        return Naming.MEGATRON if self.direction == "to-megatron" else Naming.HF

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes, computed from the source's tensors it maps from."""
        if self.direction == "to-megatron":
            m = self.plan.by_megatron()[name]
            if m.kind is Kind.COPY:
                return self.source.read_chunks(m.hf[0], chunk_bytes)
            if m.kind in (Kind.CONCAT_ROWS, Kind.GDN_SPLIT_IN_PROJ):  # parts' bytes in turn
                parts_bytes = (c for h in m.hf for c in self.source.read_chunks(h, chunk_bytes))
                return rechunk(parts_bytes, chunk_bytes)
            if m.kind is Kind.FUSED_EXPERT:
                return self._expert_bytes(m, self.tensors[name].nbytes, chunk_bytes)
            parts = [load_array(self.source, h) for h in m.hf]
            dtype = self.source.tensors[m.hf[0]].dtype
            return _yield_bytes(forward(m, parts, dtype), chunk_bytes)
        copy_of = dict(self.plan.copies)
        if name in copy_of:
            return self.read_chunks(copy_of[name], chunk_bytes)
        m = self.plan.by_hf()[name]
        if m.kind is Kind.COPY:
            return self.source.read_chunks(m.megatron, chunk_bytes)
        dtype = self.source.tensors[m.megatron].dtype
        pieces = backward(m, load_array(self.source, m.megatron), dtype)
        return _yield_bytes(pieces[m.hf.index(name)], chunk_bytes)

    def _expert_bytes(self, m: TensorMapping, nbytes: int, chunk_bytes: int) -> Iterator[bytes]:
        """Expert ``m.expert``'s contiguous bytes of the fused HF tensor: a positioned read
        where the source offers one, else its stream with the other experts skipped."""
        assert m.expert is not None
        start = m.expert * nbytes
        if isinstance(self.source, ReadsSlices):
            return self.source.read_slice_chunks(m.hf[0], start, nbytes, chunk_bytes)
        stream = self.source.read_chunks(m.hf[0], chunk_bytes)
        return rechunk(_skip(stream, start, nbytes), chunk_bytes)


def _skip(chunks: Iterator[bytes], start: int, length: int) -> Iterator[bytes]:
    """Bytes ``start .. start + length`` of a stream."""
    pos = 0
    for chunk in chunks:
        end = pos + len(chunk)
        if end > start and pos < start + length:
            yield bytes(chunk[max(0, start - pos) : min(len(chunk), start + length - pos)])
        if end >= start + length:
            return
        pos = end


def _readable(metas: list[TensorMeta]) -> bool:
    return all(m.readable for m in metas)


def as_megatron(
    hf: Checkpoint, layout: MegatronLayout = MegatronLayout.MEGATRON_CORE
) -> MappedCheckpoint:
    """Show an HF checkpoint under canonical Megatron names, as ``layout`` lays it out (a
    config key the mapping needs and does not find is a :class:`ConfigKeyError` naming the
    checkpoint's config file)."""
    try:
        plan = build_plan(hf.config, hf.tensors, "hf", layout)
    except ConfigKeyError as e:
        raise e.at(hf.config_path or f"{hf.path}/config.json") from e
    tensors: dict[str, TensorMeta] = {}
    sources: dict[str, str] = {}
    for m in plan.mappings:
        metas = [hf.tensors[h] for h in m.hf]
        dtype = _same_dtype(metas, m.megatron)
        shape = _forward_shape(m, [meta.shape for meta in metas])
        nbytes = sum(meta.nbytes for meta in metas)
        if m.kind is Kind.FUSED_EXPERT:
            nbytes //= metas[0].shape[0]
        tensors[m.megatron] = TensorMeta(
            name=m.megatron,
            dtype=dtype,
            shape=shape,
            file=metas[0].file,
            offset=0,
            nbytes=nbytes,
            readable=_readable(metas),
        )
        sources[m.megatron] = " + ".join(m.hf)
    config = {
        "model_type": "megatron",
        "num_layers": plan.num_layers,
        "mtp_num_layers": _declared(plan),
    }
    return MappedCheckpoint.over(
        hf, "megatron", config, tensors, plan=plan, direction="to-megatron", sources=sources
    )


def _declared(plan: Plan) -> int | None:
    for key in plan.family.count.keys:
        found = text_value(plan.hf_config, key, is_int)
        if found:
            count: int = found[1]  # is_int took it
            return count
    return plan.family.count.default


def as_hf(
    megatron: Checkpoint,
    hf_config: Mapping[str, Any],
    with_copies: bool | Collection[str] = True,
    layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
) -> MappedCheckpoint:
    """Show a Megatron checkpoint (saved in ``layout``) under the HF names of ``hf_config``'s
    family, with the MTP copies of embedding and head the family stores (``with_copies``:
    all, none, or these)."""
    plan = build_plan(hf_config, megatron.tensors, "megatron", layout)
    tensors: dict[str, TensorMeta] = {}
    sources: dict[str, str] = {}
    for m in plan.mappings:
        meta = megatron.tensors[m.megatron]
        for h, shape in zip(m.hf, _backward_shapes(m, meta.shape), strict=True):
            width = itemsize(meta.dtype) or 1
            numel = 1
            for d in shape:
                numel *= d
            tensors[h] = TensorMeta(
                h, meta.dtype, shape, meta.file, 0, numel * width, meta.readable
            )
            sources[h] = m.megatron
    if with_copies:
        for copy, main in plan.copies:
            if main in tensors and (with_copies is True or copy in with_copies):
                tensors[copy] = TensorMeta(copy, *_rest(tensors[main]))
                sources[copy] = f"{sources[main]} (copy of {main})"
    config = dict(hf_config)
    mtp = megatron.config.get("mtp_num_layers")
    for key in plan.family.count.keys:
        if key in config and isinstance(mtp, int):
            config[key] = mtp
    return MappedCheckpoint.over(
        megatron,
        "hf",
        config,
        dict(sorted(tensors.items())),
        plan=plan,
        direction="to-hf",
        sources=sources,
    )


def _rest(meta: TensorMeta) -> tuple[str, tuple[int, ...], str, int, int, bool]:
    return meta.dtype, meta.shape, meta.file, meta.offset, meta.nbytes, meta.readable


def require_complete(plan: Plan, where: str) -> None:
    """Refuse to convert when some tensors have no counterpart (nothing is dropped silently).
    Parts of quantized parameters (scales, packed weights) are named as such: the rules map
    full-precision weights, and Megatron checkpoints hold no quantizer's parts."""
    if not plan.unmapped:
        return
    packed = quantized_modules(plan.unmapped)
    parts = [n for n in plan.unmapped if logical_name(n, packed)[1] is not Role.WEIGHT]
    if parts:
        raise InputError(
            where,
            f"the source is quantized: {len(parts)} tensor(s) are quantization parts "
            f"({first_few(parts, 5, counted=False)}); the mapping converts full-precision "
            "weights only",
        )
    raise InputError(
        where,
        f"{len(plan.unmapped)} tensor(s) have no Megatron counterpart: "
        f"{first_few(plan.unmapped, 5, counted=False)}",
    )
