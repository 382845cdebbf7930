"""Tensor metadata: where each tensor's bytes lie, one tensor at a time or a file's tensors in
columns."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Collection, Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class ByteSpan:
    """``length`` bytes at ``offset`` of ``file``: a tensor's bytes lie in one or more, in C
    order (checkpoints that know this offer ``byte_spans(name)``; writers copy them in the
    kernel)."""

    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor lives on disk, as its file header declares it."""

    name: str
    dtype: str
    """A code of the dtype registry (:mod:`mtpcheck.dtypes`): the safetensors code, e.g.
    ``BF16`` or ``F8_E4M3``, or a GGML block type such as ``Q4_K``; a reader's ``torch.<name>``
    for a torch dtype the registry lacks."""
    shape: tuple[int, ...]
    file: str
    """Path of the file holding the bytes."""
    offset: int
    """Absolute byte offset of the first data byte in ``file``."""
    nbytes: int
    readable: bool = True
    """False when the file ends before the tensor's last byte (a truncated shard)."""

    @property
    def numel(self) -> int:
        """Elements the tensor holds."""
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class TensorColumns:
    """The tensors of one file, column by column in header order (one object per file, not
    per tensor: a DeepSeek-V3 checkpoint declares 92k tensors)."""

    file: str
    file_size: int
    """Bytes the file holds; a tensor ending past it is unreadable."""
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: array[int]
    """Absolute byte offset of each tensor's first byte (``array('q')``)."""
    sizes: array[int]
    """Bytes of each tensor (``array('q')``)."""

    def meta(self, i: int, name: str) -> TensorMeta:
        """The :class:`TensorMeta` of row ``i``, named ``name``."""
        offset = self.offsets[i]
        nbytes = self.sizes[i]
        return TensorMeta(
            name=name,
            dtype=self.dtypes[i],
            shape=self.shapes[i],
            file=self.file,
            offset=offset,
            nbytes=nbytes,
            readable=offset + nbytes <= self.file_size,
        )


class TensorTable(Mapping[str, TensorMeta]):
    """Tensor metadata of several files as one mapping in name order, kept in their columns:
    a :class:`TensorMeta` is built when a name is first looked up, and kept (checks look the
    MTP tensors up many times; the other names of a 92k-tensor checkpoint never). Names must
    be unique across the files (:meth:`of` returns None otherwise)."""

    __slots__ = ("_parts", "_starts", "_position", "_sorted", "_built")

    def __init__(
        self, parts: list[TensorColumns], starts: list[int], position: dict[str, int]
    ) -> None:
        self._parts = parts
        self._starts = starts  # each part's first position in the columns laid end to end
        self._position = position
        self._sorted: list[str] | None = None
        self._built: dict[str, TensorMeta] = {}

    @classmethod
    def of(cls, parts: Iterable[TensorColumns]) -> TensorTable | None:
        """The table of ``parts``, or None when a name occurs twice."""
        parts = list(parts)
        starts = [0, *accumulate(len(part.names) for part in parts)]
        position: dict[str, int] = {}
        for part, start in zip(parts, starts[:-1], strict=True):
            position.update(zip(part.names, range(start, start + len(part.names)), strict=True))
        unique = len(position) == starts[-1]
        return cls(parts, starts[:-1], position) if unique else None

    def __getitem__(self, name: str) -> TensorMeta:
        meta = self._built.get(name)
        if meta is None:
            i = self._position[name]
            k = bisect_right(self._starts, i) - 1
            meta = self._built[name] = self._parts[k].meta(i - self._starts[k], name)
        return meta

    # narrower than Mapping.get (a default of any type): callers pass None or a TensorMeta
    def get(self, name: str, default: TensorMeta | None = None) -> TensorMeta | None:  # type: ignore[override]
        """The tensor ``name``, or ``default`` when the table has none."""
        return self[name] if name in self._position else default

    def __contains__(self, name: object) -> bool:
        return name in self._position

    def __iter__(self) -> Iterator[str]:
        if self._sorted is None:
            self._sorted = sorted(self._position)
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self._position)

    def __repr__(self) -> str:
        return f"TensorTable({len(self)} tensors in {len(self._parts)} files)"

    @property
    def names(self) -> KeysView[str]:
        """The names, as a set-like view whose membership test runs in C (``in`` on the
        table itself is a Python call: checks that test thousands of names use this)."""
        return self._position.keys()

    @property
    def parts(self) -> tuple[TensorColumns, ...]:
        """The column blocks the table is made of, in order."""
        return tuple(self._parts)


def names_of(tensors: Mapping[str, TensorMeta]) -> Collection[str]:
    """The names of ``tensors``, with a membership test in C where the mapping has one."""
    return tensors.names if isinstance(tensors, TensorTable) else tensors.keys()


def total_nbytes(tensors: Mapping[str, TensorMeta]) -> int:
    """Bytes of all ``tensors`` (summed column by column for a :class:`TensorTable`)."""
    if isinstance(tensors, TensorTable):
        return sum(sum(part.sizes) for part in tensors.parts)
    return sum(m.nbytes for m in tensors.values())


def files_of(tensors: Mapping[str, TensorMeta]) -> set[str]:
    """The files holding ``tensors``."""
    if isinstance(tensors, TensorTable):
        return {part.file for part in tensors.parts if part.names}
    return {m.file for m in tensors.values()}
