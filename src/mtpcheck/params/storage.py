"""How a logical parameter is stored, in words: BF16, FP8, INT8, INT4, NF4, NVFP4 (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from mtpcheck.model import TensorMeta
from mtpcheck.params.encodings import Encoding, encoding_of, label_of
from mtpcheck.params.grouping import LogicalParam
from mtpcheck.params.parts import Role
from mtpcheck.params.scheme import Scheme
from mtpcheck.units import first_few


@dataclass(frozen=True)
class Storage:
    """The storage of one parameter, in words a person compares across layers."""

    label: str
    """``BF16``, ``FP8``, ``INT8``, ``INT4`` (packed), ``NF4``, ``FP4``, ``NVFP4``, ``MXFP4``,
    ``packed``."""
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
    encoding = encoding_of(param, tensors, scheme)
    values = param.values
    if encoding is None or values is None:
        return Storage("absent", False, parts)
    label = label_of(encoding, param, tensors[values].dtype, scheme)
    return Storage(label, encoding is not Encoding.FULL, parts)


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
            rest.append(f"{label}: {first_few(names, shown)}")
    return f"{first} ({'; '.join(rest)})"
