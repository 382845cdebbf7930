"""How a logical parameter is stored: full precision, FP8, INT8, packed INTn, NVFP4 (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mtpcheck.dtypes import DTYPES, Kind, is_fp8, is_high_precision
from mtpcheck.model import TensorMeta
from mtpcheck.params.grouping import LogicalParam
from mtpcheck.params.parts import Role
from mtpcheck.params.scheme import Scheme


@dataclass(frozen=True)
class Storage:
    """The storage of one parameter, in words a person compares across layers."""

    label: str
    """``BF16``, ``FP8``, ``INT8``, ``INT4`` (packed), ``NVFP4``, ``MXFP4``, ``packed``."""
    quantized: bool
    parts: tuple[tuple[str, str, tuple[int, ...]], ...]
    """(suffix, dtype, shape) of each stored part."""

    @property
    def detail(self) -> str:
        """Each stored part as ``suffix dtype [shape]``, joined by ``+``."""
        return " + ".join(f"{suffix} {dtype} {list(shape)}" for suffix, dtype, shape in self.parts)


def _suffix(name: str) -> str:
    return name.rpartition(".")[2]


def storage_of(param: LogicalParam, tensors: Mapping[str, TensorMeta], scheme: Scheme) -> Storage:
    """What ``param`` is stored as (the weight bits a serving engine must be built for)."""
    parts = tuple(
        (_suffix(n), meta.dtype, meta.shape)
        for _, n in param.parts
        if (meta := tensors.get(n)) is not None
    )
    packed = param.part(Role.PACKED)
    values = param.values
    meta = tensors.get(values) if values is not None else None
    if meta is None:
        return Storage("absent", False, parts)
    dtype = meta.dtype
    fp4 = param.part(Role.GLOBAL_SCALE) is not None
    if packed is None and is_high_precision(dtype):
        return Storage(dtype, False, parts)
    if is_fp8(dtype):
        return Storage("FP8", True, parts)
    if dtype == "U8" and (fp4 or _scale_is_fp8(param, tensors)):
        return Storage("NVFP4" if fp4 else "MXFP4", True, parts)
    if packed is None:
        known = DTYPES.get(dtype)
        if known is not None and known.kind in (Kind.INT, Kind.UINT) and known.bits == 8:
            return Storage("INT8", True, parts)
        return Storage(dtype, True, parts)
    bits = scheme.weight_bits
    return Storage(f"INT{bits}" if bits else "packed", True, parts)


def _scale_is_fp8(param: LogicalParam, tensors: Mapping[str, TensorMeta]) -> bool:
    scale = param.part(Role.SCALE)
    meta = tensors.get(scale) if scale is not None else None
    return meta is not None and (is_fp8(meta.dtype) or meta.dtype == "F8_E8M0")


def is_matrix(param: LogicalParam, tensors: Mapping[str, TensorMeta]) -> bool:
    """Whether ``param`` is a weight matrix (what quantizers quantize): packed, or a stored
    weight of two or more dimensions (a norm or a bias has one)."""
    if param.part(Role.PACKED) is not None:
        return True
    weight = param.part(Role.WEIGHT)
    meta = tensors.get(weight) if weight is not None else None
    return meta is not None and len(meta.shape) >= 2


def describe_storages(stored: Iterable[tuple[str, Storage]], shown: int = 3) -> str:
    """One label for a layer's matrices, given as (short name, storage): ``INT4``, or the
    most common quantized form and the exceptions by name (``INT4 (BF16: mlp.gate)``)."""
    by_label: dict[str, list[str]] = {}
    quantized: Counter[str] = Counter()
    for name, storage in stored:
        by_label.setdefault(storage.label, []).append(name)
        if storage.quantized:
            quantized[storage.label] += 1
    if not by_label:
        return "no matrices"
    if len(by_label) == 1:
        return next(iter(by_label))
    common = Counter({k: len(v) for k, v in by_label.items()})
    first = (quantized or common).most_common(1)[0][0]
    rest = []
    for label, names in sorted(by_label.items()):
        if label != first:
            names = sorted(names)
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            rest.append(f"{label}: {', '.join(names[:shown])}{more}")
    return f"{first} ({'; '.join(rest)})"
