"""The built-in converters: HF safetensors <-> Megatron torch_dist, through the mapping."""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from mtpcheck.convert.file_ranges import FileRanges, map_private
from mtpcheck.dtypes import itemsize, torch_name
from mtpcheck.errors import ConfigKeyError, InputError
from mtpcheck.families import MtpFamily
from mtpcheck.formats.chunked_read import read_spans_into, slice_spans
from mtpcheck.formats.hf_safetensors import FORMAT as HF_FORMAT
from mtpcheck.mapping import MappedCheckpoint, as_hf, as_megatron
from mtpcheck.mapping.rules import Kind
from mtpcheck.mapping.views import backward, forward, load_array, require_complete
from mtpcheck.model import ByteSpan, Checkpoint, HasByteSpans, HasSpanReader, read_whole
from mtpcheck.ticker import Ticker
from mtpcheck.torch_threads import configure_torch_threads

OWN_CONVERTER = "give converters as --to-megatron CMD and --to-hf CMD"
"""What to do instead, said by ``roundtrip`` (whose options those are)."""
CONVERT_ELSEWHERE = (
    "convert it with such a tool and compare with `mtpcheck diff SRC MEGATRON`, or round-trip "
    "it with `mtpcheck roundtrip SRC --to-megatron CMD --to-hf CMD`"
)
"""What to do instead, said by ``convert hf-to-megatron``."""


def require_hf(ckpt: Checkpoint) -> None:
    """The round trip and hf-to-megatron start from an HF checkpoint whose bytes are at hand
    (read by offset); anything else is refused up front (:class:`InputError`: exit 2)."""
    if ckpt.format != HF_FORMAT:
        raise InputError(
            ckpt.path,
            f"is a {ckpt.format} checkpoint; the round trip and hf-to-megatron start from an HF "
            "safetensors checkpoint (compare a Megatron checkpoint with its HF source with "
            "`mtpcheck diff HF MEGATRON`)",
        )


def require_unquantized(hf: Checkpoint) -> None:
    """The HF <-> Megatron mapping moves full-precision weights: a quantized source (declared
    so, or holding quantized weights) is refused up front, naming its scheme
    (:class:`InputError`: exit 2)."""
    from mtpcheck.params import Method, declared_scheme, group

    scheme = declared_scheme(hf)
    if scheme.method is not Method.NONE:
        named = ", ".join((scheme.declared or scheme.method.value, *scheme.formats))
    else:
        quantized = [p for p in group(hf.tensors).values() if p.quantized(hf.tensors)]
        if not quantized:
            return
        dtype = hf.tensors[quantized[0].values or quantized[0].name].dtype
        named = f"undeclared: {quantized[0].name} is stored {dtype}"
    raise InputError(
        hf.path,
        f"the source is quantized ({named}): the HF <-> Megatron mapping converts "
        "full-precision weights only; compare a quantized copy with its source with "
        "`mtpcheck diff SRC QUANTIZED --dequantize`",
    )


def require_writable(hf: Checkpoint, instead: str = OWN_CONVERTER) -> str:
    """The writer's family key for ``hf``; input the built-in converter cannot take is
    refused up front, saying what to do ``instead`` (an :class:`InputError`: exit 2)."""
    require_hf(hf)
    return writer_family(hf.config, hf.path, instead)


def writer_family(hf_config: Mapping[str, Any], where: str, instead: str = OWN_CONVERTER) -> str:
    """The writer's layout key for an HF config (``where`` names it in the error): the
    family record's :class:`~mtpcheck.families.interface.MegatronWriter`."""
    from mtpcheck.mapping.plan import MappingError, mappable_family, mapped_families

    try:
        family = mappable_family(hf_config)
    except MappingError as e:
        raise InputError(
            where,
            f"{e}: mtpcheck can neither write its Megatron checkpoint nor judge one (families "
            f"with a mapping: {mapped_families()})",
        ) from e
    if family.support.writer is None:
        raise InputError(where, cannot_write(family, instead))
    return family.support.writer.layout


def cannot_write(family: MtpFamily, instead: str) -> str:
    """Why the built-in converter refuses ``family``, which converter does convert it (the
    family record's), and what to do ``instead``."""
    support = family.support
    why = f": {support.no_writer}" if support.no_writer else " yet"
    others = "; ".join(c.words() for c in support.elsewhere)
    return f"the built-in converter cannot write {family.display}{why}; " + (
        f"{others}: {instead}" if others else instead
    )


def require_empty_destination(dst: Path) -> None:
    """Refuse a destination that holds anything, or is a broken symlink (checked before any
    work is done)."""
    if dst.is_symlink() and not dst.exists():
        raise InputError(dst, "destination is a broken symlink")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise InputError(dst, "destination exists and is not empty; refusing to overwrite")


def _torch_tensor(ckpt: Checkpoint, name: str) -> Any:
    import torch

    meta = ckpt.tensors[name]
    buf = read_whole(ckpt, name)
    dtype = getattr(torch, torch_name(meta.dtype))
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(meta.shape)


class _OneAtATime:
    """The tensors of a Megatron view, produced one at a time while megatron-core writes them.

    ``placeholders`` have each tensor's shape and dtype over untouched anonymous memory (no
    resident pages): they only plan the save. ``materialise`` (called by the writer right
    before it writes a tensor, or a view of one) returns the real bytes: a plain copy is a
    private copy-on-write map of the source shard (``ACCESS_COPY``: no copy, no anonymous
    memory), and so is a view lying inside one part of a ``[gate; up]`` concatenation (a
    SwiGLU half: the part's own source tensor, nothing concatenated); any other tensor is
    computed from such maps into an anonymous map of its own.

    The writer may run several threads, each writing its own file one item after another.
    Each thread holds what it was last given until it asks for its next item (by then the
    previous one is written); what no thread holds any more has its pages freed (the writer
    keeps a reference to every tensor but never reads it again). Peak memory is about one
    tensor per writer thread, not the checkpoint. A computed tensor asked for by two threads
    at once (two views of it in different files) is computed once and shared.

    The source maps are made through ``ranges``, which tells the writer, while a map is held,
    which file bytes it shows (so the writer can copy them inside the kernel).
    """

    def __init__(
        self,
        view: MappedCheckpoint,
        ticker: Ticker | None = None,
        ranges: FileRanges | None = None,
    ) -> None:
        import torch

        self.view = view
        self.ticker = ticker
        self.ranges = ranges if ranges is not None else FileRanges()
        self.mappings = view.plan.by_megatron()
        self.placeholders: dict[str, Any] = {}
        self._owner: dict[int, str] = {}
        for name, meta in view.tensors.items():
            dtype = getattr(torch, torch_name(meta.dtype))
            if meta.nbytes:
                raw = torch.frombuffer(_anonymous(meta.nbytes), dtype=torch.uint8)
                tensor = raw.view(dtype).reshape(meta.shape)
                self._owner[tensor.untyped_storage().data_ptr()] = name
            else:
                tensor = torch.empty(meta.shape, dtype=dtype)
            self.placeholders[name] = tensor
        self._lock = threading.Lock()
        self._held = threading.local()
        """Per writer thread: the key (name, part) and bytes it was last given."""
        self._shared: dict[tuple[str, int | None], list[Any]] = {}
        """Key -> [bytes, number of threads holding them]."""
        self._produced: set[str] = set()

    def unproduced(self) -> list[str]:
        """Tensors the writer never asked for: their placeholders (zeros) would be on disk."""
        return sorted(set(self._owner.values()) - self._produced)

    def materialise(self, data: Any) -> Any:
        import torch

        name = self._owner.get(data.untyped_storage().data_ptr())
        if name is None or not data.nbytes:  # not a placeholder, or nothing to produce
            return data
        start = data.storage_offset() * data.element_size()
        part = self._part_of(name, start, data.nbytes) if data.is_contiguous() else None
        raw = self._acquire(name, part)
        if self.ticker is not None:
            with self._lock:
                self.ticker.advance(data.nbytes, name)
        if not data.is_contiguous():
            whole = torch.frombuffer(raw, dtype=torch.uint8).view(data.dtype)
            return whole.as_strided(data.size(), data.stride(), data.storage_offset())
        if part is not None:
            start -= self._part_start(name, part)
        piece = torch.frombuffer(raw[start : start + data.nbytes], dtype=torch.uint8)
        return piece.view(data.dtype).reshape(data.shape)

    def _part_of(self, name: str, start: int, nbytes: int) -> int | None:
        """The index of the ``[gate; up]`` part holding bytes ``[start, start + nbytes)`` of
        tensor ``name`` entirely, where its bytes are at hand as a map; else None."""
        m = self.mappings[name]
        if m.kind is not Kind.CONCAT_ROWS:
            return None
        begin = 0
        for index, hf in enumerate(m.hf):
            end = begin + self.view.source.tensors[hf].nbytes
            if begin <= start and start + nbytes <= end:
                return index if _mappable(self.view.source, hf) else None
            begin = end
        return None

    def _part_start(self, name: str, part: int) -> int:
        hf = self.mappings[name].hf
        return sum(self.view.source.tensors[h].nbytes for h in hf[:part])

    def _acquire(self, name: str, part: int | None) -> memoryview:
        """The bytes of ``(name, part)`` for this thread, which lets go of what it held."""
        key = (name, part)
        held = getattr(self._held, "key", None)
        if held == key:
            mine: memoryview = self._held.raw  # thread-local slots are untyped
            return mine
        with self._lock:
            if held is not None:
                self._release(held)
            self._produced.add(name)
            entry = self._shared.get(key)
            if entry is not None:
                entry[1] += 1
        if entry is None:
            # computed outside the lock: the other threads go on writing meanwhile
            raw = self._compute(name) if part is None else self._part_bytes(name, part)
            with self._lock:
                entry = self._shared.setdefault(key, [raw, 0])
                entry[1] += 1
            if entry[0] is not raw:  # another thread made it meanwhile: this copy goes unused
                self.ranges.forget(raw)  # its address may be reused by a later map
        shared: memoryview = entry[0]  # the entry is [bytes, holders]
        self._held.key, self._held.raw = key, shared
        return shared

    def _release(self, key: tuple[str, int | None]) -> None:
        """One thread less holds ``key`` (under the lock); free its pages once none does."""
        entry = self._shared[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self._shared[key]
            self.ranges.forget(entry[0])
            _drop_pages(entry[0])

    def _part_bytes(self, name: str, part: int) -> memoryview:
        mapped = _mapped_bytes(self.view.source, self.mappings[name].hf[part], self.ranges)
        if mapped is None:  # checked by _part_of; a file that went away since
            raise InputError(self.view.source.path, f"cannot map {self.mappings[name].hf[part]}")
        return mapped

    def _compute(self, name: str) -> memoryview:
        """The bytes of Megatron tensor ``name``."""
        import numpy as np

        m = self.mappings[name]
        if m.kind is Kind.COPY:
            mapped = _mapped_bytes(self.view.source, m.hf[0], self.ranges)
            if mapped is not None:
                return mapped
        meta = self.view.tensors[name]
        out = memoryview(_anonymous(meta.nbytes))
        if m.kind is Kind.COPY:
            pos = 0
            for chunk in self.view.source.read_chunks(m.hf[0], 1 << 24):
                out[pos : pos + len(chunk)] = chunk
                pos += len(chunk)
            return out
        parts = [_source_array(self.view.source, h) for h in m.hf]
        width = itemsize(meta.dtype)
        target = np.frombuffer(out, dtype=f"<u{width}").reshape(meta.shape)
        if m.kind is Kind.CONCAT_ROWS:
            np.concatenate(parts, axis=0, out=target)
        else:
            target[...] = forward(m, parts, meta.dtype)
        return out


def _anonymous(nbytes: int) -> mmap.mmap:
    """Private anonymous memory, unmapped (returned to the system) when the last user goes."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


def _drop_pages(raw: memoryview) -> None:
    """Free the pages of a tensor the writer has written. The writer keeps a reference to the
    last tensor written under each key (for a format we do not use) and never reads it again;
    a file map's pages stay in the page cache and would fault back in, anonymous ones would
    read as zeros (and are only ever dropped once written)."""
    mapped = raw.obj
    if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def _mapped_bytes(
    ckpt: Checkpoint, name: str, ranges: FileRanges | None = None
) -> memoryview | None:
    """Tensor ``name`` of an HF safetensors checkpoint as a private copy-on-write map of its
    shard (nothing read until touched; pages shared with the page cache); None for a
    checkpoint whose tensors do not lie at plain file offsets. Mapped through ``ranges``
    (and registered there) when given."""
    meta = ckpt.tensors[name]
    if not _mappable(ckpt, name):
        return None
    if ranges is not None:
        return ranges.map(meta.file, meta.offset, meta.nbytes)
    try:
        with open(meta.file, "rb") as f:  # the map outlives the descriptor
            return map_private(f.fileno(), meta.offset, meta.nbytes)
    except (OSError, ValueError):  # e.g. a file system without mmap: read it instead
        return None


def _mappable(ckpt: Checkpoint, name: str) -> bool:
    """Whether :func:`_mapped_bytes` can map tensor ``name`` (without mapping it)."""
    meta = ckpt.tensors[name]
    return isinstance(ckpt, HasSpanReader) and meta.readable and bool(meta.nbytes)


def _source_array(ckpt: Checkpoint, name: str) -> Any:
    """One source tensor as unsigned ints of its element width, mapped when possible."""
    import numpy as np

    raw = _mapped_bytes(ckpt, name)
    if raw is None:
        return load_array(ckpt, name)
    meta = ckpt.tensors[name]
    width = itemsize(meta.dtype)
    if width is None:
        return load_array(ckpt, name)  # refuses sub-byte dtypes with the usual message
    return np.frombuffer(raw, dtype=f"<u{width}").reshape(meta.shape)


def hf_to_megatron(
    hf: Checkpoint,
    dst: Path,
    durable: bool = True,
    log: Callable[[str], None] | None = None,
    writer_threads: int = 1,
) -> Path:
    """Write ``hf`` as a Megatron-LM torch_dist checkpoint (``dst/release``); returns its dir.

    ``durable=False`` leaves the files to the page cache (no ``fsync``): for intermediates.
    ``log`` gets a progress line every few seconds of a long conversion. ``writer_threads``
    files are written at once (``__0_0.distcp`` ... , one per thread).
    """
    from mtpcheck.convert import megatron_config

    key = require_writable(hf)
    require_empty_destination(dst)
    view = as_megatron(hf)
    require_complete(view.plan, hf.path)
    # megatron-core takes seconds to import: only once the input is known to be convertible
    from mtpcheck.convert.torch_dist_writer import write_torch_dist

    configure_torch_threads()  # torch is imported now: see mtpcheck.torch_threads
    total = sum(m.nbytes for m in view.tensors.values())
    ticker = Ticker("writing Megatron", total, log) if log is not None else None
    ranges = FileRanges()
    tensors = _OneAtATime(view, ticker, ranges)
    try:
        kwargs = megatron_config.transformer_config_kwargs(hf.config, key)
        args = megatron_config.args_namespace(hf.config, key)
    except ConfigKeyError as e:
        raise e.at(f"{hf.path}/config.json") from e
    try:
        written = write_torch_dist(
            dst,
            tensors.placeholders,
            kwargs,
            args,
            "release",
            materialise=tensors.materialise,
            durable=durable,
            thread_count=writer_threads,
            file_bytes=ranges,  # plain copies go file to file, inside the kernel
        )
    finally:
        ranges.close()
    missed = tensors.unproduced()
    if missed:  # a writer that reads tensors some other way: refuse rather than leave zeros
        raise RuntimeError(f"the torch_dist writer never produced {len(missed)} tensors: {missed}")
    if ticker is not None:
        ticker.finish(f"{len(view.tensors)} tensors")
    return written


def megatron_to_hf(
    megatron: Checkpoint,
    dst: Path,
    hf_config: Mapping[str, Any],
    with_copies: bool | Collection[str] = True,
    durable: bool = True,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write ``megatron`` as HF sharded safetensors + index + config.json under ``dst``
    (``fsync``ed unless ``durable=False``); ``log`` gets progress lines of a long one."""
    from mtpcheck.convert.hf_writer import write_hf

    require_empty_destination(dst)
    view = as_hf(megatron, hf_config, with_copies)
    if view.plan.unmapped:
        shown = ", ".join(view.plan.unmapped[:5])
        raise InputError(
            megatron.path,
            f"{len(view.plan.unmapped)} tensor(s) have no HF counterpart: {shown}",
        )
    total = sum(m.nbytes for m in view.tensors.values())
    ticker = Ticker("writing HF", total, log) if log is not None else None
    files = write_hf(_SplitOnce(view), dst, config=view.config, durable=durable, ticker=ticker)
    if ticker is not None:
        ticker.finish(f"{len(view.tensors)} tensors")
    return files


class _SplitOnce:
    """A Megatron checkpoint under HF names (``view``) for the HF writer, each fused Megatron
    tensor loaded and split once: the writer asks for q, k and v (gate and up) in turn, and
    each would load the whole fused tensor again. Holds one tensor's pieces at a time; the
    bytes are those of ``view.read_chunks``."""

    def __init__(self, view: MappedCheckpoint) -> None:
        self.view = view
        self.tensors = view.tensors
        self._to_megatron = view.plan.by_hf()
        self._copy_of = dict(view.plan.copies)
        self._pieces: tuple[str | None, list[Any]] = (None, [])

    def byte_spans(self, name: str) -> list[ByteSpan] | None:
        """Where a tensor lies in the Megatron files when it is a plain copy or one row block
        of a ``[gate; up]`` fc1 (None otherwise: it is computed)."""
        name = self._copy_of.get(name, name)
        m = self._to_megatron[name]
        source = self.view.source
        if m.kind not in (Kind.COPY, Kind.CONCAT_ROWS) or not isinstance(source, HasByteSpans):
            return None
        spans = source.byte_spans(m.megatron)
        if spans is None or m.kind is Kind.COPY:
            return spans
        size = self.tensors[name].nbytes  # the row blocks are equal, in the order of m.hf
        return slice_spans(spans, m.hf.index(name) * size, size)

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes | memoryview]:
        """The tensor's bytes: a plain copy read from the source, a split piece as views of
        the piece (the writer writes them as they are)."""
        import numpy as np

        name = self._copy_of.get(name, name)
        m = self._to_megatron[name]
        if m.kind is Kind.COPY:
            return self.view.source.read_chunks(m.megatron, chunk_bytes)
        if self._pieces[0] != m.megatron:
            self._pieces = (None, [])
            whole = _load(self.view.source, m.megatron)
            dtype = self.view.source.tensors[m.megatron].dtype
            pieces = backward(m, whole, dtype)
            self._pieces = (m.megatron, [np.ascontiguousarray(p) for p in pieces])
        piece = self._pieces[1][m.hf.index(name)]
        raw = piece.reshape(-1).view(np.uint8).data
        return (raw[i : i + chunk_bytes] for i in range(0, len(raw), chunk_bytes))


def _load(ckpt: Checkpoint, name: str) -> Any:
    """A tensor's bits as unsigned ints of its element width, read into one buffer."""
    import numpy as np

    meta = ckpt.tensors[name]
    width = itemsize(meta.dtype)
    if width is None:
        return load_array(ckpt, name)  # refuses sub-byte dtypes with the usual message
    out = np.empty(meta.nbytes, dtype=np.uint8)
    spans = ckpt.byte_spans(name) if isinstance(ckpt, HasByteSpans) else None
    if spans is not None and sum(s.length for s in spans) == meta.nbytes:
        pos = read_spans_into(spans, out.data)
    else:
        pos = 0
        for chunk in ckpt.read_chunks(name, 1 << 24):
            out[pos : pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            pos += len(chunk)
    if pos != meta.nbytes:
        raise InputError(ckpt.path, f"{name}: read {pos} bytes, expected {meta.nbytes}")
    return out.view(f"<u{width}").reshape(meta.shape)
