"""Megatron-Core ``torch_dist`` checkpoints, read without megatron-core.

Accepted inputs: a save root with ``latest_checkpointed_iteration.txt`` (an iteration number or
``release``), an iteration directory (``iter_XXXXXXX/`` or ``release/``), or a file inside one.
An iteration directory holds ``metadata.json`` (written last, when the save finished),
``.metadata`` (the pickled torch.distributed.checkpoint ``Metadata``), ``__*.distcp`` data files
and ``common.pt``; Megatron-Bridge adds ``run_config.yaml``.

Opening reads ``.metadata``, ``common.pt`` and ``run_config.yaml`` only. Each tensor chunk is a
``torch.save`` blob at a byte range of a ``.distcp`` file; :meth:`read_chunks` reads just the
chunks of the one tensor asked for. Where the chunks are plain tensor records that tile the
tensor in row bands (one chunk, a layer or expert of a stacked chunk, TP row splits, SwiGLU
halves), their bytes are streamed by offset in bounded reads
(:mod:`mtpcheck.formats.torch_save_record`); otherwise the chunks' elements are mapped and
assembled (numpy). Nothing here imports torch. Keys are mapped to canonical names by
:mod:`mtpcheck.formats.torch_dist_keys` (the scheme the torch_dist writer writes by), so that:

* a stacked key ``<block>.layers.X`` with a leading layer axis becomes ``<block>.layers.{k}.X``;
* ``...mlp.experts.experts.X`` with an expert axis becomes ``...mlp.experts.local_experts.{e}.X``
  (and ``experts.experts.{e}.X`` of singleton-shard saves likewise);
* fused norms become the local spec's, ``mtp_model_layer`` becomes ``transformer_layer``;
* ``linear_fc1.weight_w`` / ``linear_fc1.weight_v`` (gate and up halves of singleton-shard saves)
  become one ``linear_fc1.weight``, gate rows first, and the gated delta net's row parts
  (``in_proj.weight.query``, ...) one tensor, in the order of
  :data:`~mtpcheck.formats.torch_dist_keys.ROW_PARTS`;

and additionally:

* ``embedding.word_embeddings.weight`` and ``output_layer.weight`` keep only ``vocab_size`` rows
  when the saved args declare a larger ``padded_vocab_size``; otherwise all stored rows.

``_extra_state`` items and optimizer, RNG and other non-model keys are ignored. ``config`` holds
the JSON-safe fields of ``common.pt['args']``, overlaid by ``run_config.yaml``'s ``model:``
section, plus ``model_type: "megatron"``. ``mtp_num_layers`` keeps its saved value, ``None``
included (MTP off); ``num_layers`` is counted from the tensors when no config declares it.

The pickle readers are imported where a Megatron checkpoint is read, so that sniffing (every
input passes through it) and ``inspect`` of a Hugging Face checkpoint do not import them.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, shown
from mtpcheck.formats.chunked_read import (
    SMALL_FILE_BYTES,
    read_spans,
    read_text_capped,
    slice_spans,
)
from mtpcheck.formats.megatron_common import (
    EMBEDDING_NAMES,
    MegatronReaderBase,
    default_layer_count,
    inside,
    is_model_key,
    odd_number,
    tensor_chunks,
    unpadded_rows,
    wrapper_prefix,
)
from mtpcheck.formats.megatron_dist_config import load_config
from mtpcheck.formats.torch_dist_keys import KeyTemplate, row_part_order
from mtpcheck.formats.torch_pickle import StoredTensor, TorchDType, TorchReadError
from mtpcheck.model import ByteSpan, CheckpointData, IntegrityIssue, Naming, TensorMeta

FORMAT = "megatron-torch-dist"
_SNIFFED_FILES = (".metadata", "metadata.json", "common.pt")
MAX_TENSORS = 1 << 20
"""Per-layer / per-expert tensors one ``.metadata`` may expand to (DeepSeek-V3 has ~92k)."""


@dataclass(frozen=True)
class _Piece:
    """One stored chunk (or the part of it) that fills a region of a canonical tensor."""

    file: str
    offset: int
    length: int
    chunk_offsets: tuple[int, ...]
    chunk_sizes: tuple[int, ...]
    fixed: tuple[int, ...]
    """Indices along the leading layer/expert axes that this canonical tensor takes."""
    row_shift: int = 0


@dataclass
class _Plan:
    key: str
    dtype: Any
    shape: tuple[int, ...]
    pieces: list[_Piece] = field(default_factory=list)
    rows: int | None = None


@dataclass(frozen=True)
class MegatronDistCheckpoint(CheckpointData):
    """An opened torch_dist checkpoint; tensor bytes are read per tensor, on demand."""

    directory: str
    plans: Mapping[str, _Plan] = field(repr=False)
    cross_checked: str = ".metadata and the data files"
    format: str = FORMAT
    naming: Naming = Naming.MEGATRON

    def byte_spans(self, name: str) -> list[ByteSpan] | None:
        """The tensor's bytes as ranges of the data files; None where they must be assembled."""
        if not self.tensors[name].readable:
            return None
        return _row_band_spans(Path(self.directory), self.plans[name])

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes: file ranges where it lies in whole rows, else assembled from its
        stored chunks."""
        meta = self.tensors[name]
        if not meta.readable:
            raise InputError(
                meta.file, f"tensor {shown(name, 200)} has chunks past the end of the file"
            )
        spans = self.byte_spans(name)
        if spans is None:
            directory = Path(self.directory)
            yield from tensor_chunks(_assemble(directory, self.plans[name]), chunk_bytes)
        else:
            yield from read_spans(spans, chunk_bytes, "file ended inside a tensor chunk")


class MegatronDistReader(MegatronReaderBase):
    """Reader for Megatron-Core torch_dist checkpoints."""

    name = FORMAT
    what = "Megatron torch_dist"
    broken_tracker_sniffs = True

    def looks(self, directory: Path) -> bool:
        """A ``.metadata``, ``metadata.json`` or ``.distcp`` file in ``directory``."""
        if (directory / ".metadata").is_file() or (directory / "metadata.json").is_file():
            return True
        return any(directory.glob("*.distcp"))

    def sniff(self, path: Path) -> bool:
        """A torch_dist file by its name, or a directory holding (an iteration of) one."""
        if path.is_file():
            return path.name in _SNIFFED_FILES or path.suffix == ".distcp"
        return path.is_dir() and self.sniff_dir(path)

    def open(self, path: Path) -> MegatronDistCheckpoint:
        """Open the checkpoint at ``path`` (a save root, an iteration or one of its files)."""
        directory = self.iteration_dir(path, path.parent if path.is_file() else path)
        metadata_file = directory / ".metadata"
        if not metadata_file.is_file():
            raise InputError(
                metadata_file, "missing: a torch_dist checkpoint needs its .metadata tensor index"
            )
        if not (directory / "metadata.json").is_file():
            other = "" if (directory / "common.pt").is_file() else " or a plain DCP save"
            raise InputError(
                directory,
                f"half-written torch_dist checkpoint{other}: .metadata is present but "
                "metadata.json is missing (the save did not finish; metadata.json is written last)",
            )
        _check_metadata_json(directory / "metadata.json")
        from mtpcheck.formats.safe_pickle import load_raw_pickle

        metadata = load_raw_pickle(metadata_file, trust_pickle=self.trust_pickle)
        config, config_path, issues = load_config(directory, metadata, self.trust_pickle)
        plans, plan_issues = _build_plans(metadata_file, metadata, config)
        issues.extend(plan_issues)
        tensors, range_issues = _tensor_metas(directory, plans)
        issues.extend(range_issues)
        default_layer_count(config, tensors)
        return MegatronDistCheckpoint(
            path=str(path),
            config=config,
            config_path=config_path,
            tensors=tensors,
            issues=tuple(issues),
            directory=str(directory),
            plans=plans,
        )


def _check_metadata_json(path: Path) -> None:
    try:
        raw = json.loads(read_text_capped(path, SMALL_FILE_BYTES))
    except (ValueError, RecursionError) as e:  # Recursion: too deep
        raise InputError(path, f"invalid JSON ({e})") from e
    backend = raw.get("sharded_backend") if isinstance(raw, dict) else None
    if backend != "torch_dist":
        raise InputError(
            path, f"sharded_backend is {shown(backend, 200)}; only 'torch_dist' is supported"
        )


# --- tensor plans -------------------------------------------------------------------------


def _build_plans(
    metadata_file: Path, metadata: Any, config: Mapping[str, Any]
) -> tuple[dict[str, _Plan], list[IntegrityIssue]]:
    state = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(state, dict) or not isinstance(storage, dict):
        raise InputError(metadata_file, "not a torch.distributed.checkpoint Metadata object")
    locations = {
        (fqn, _sizes(getattr(k, "offset", None))): v
        for k, v in storage.items()
        if type(fqn := getattr(k, "fqn", None)) is str
    }
    halves: dict[str, dict[str | None, _Plan]] = {}
    duplicates: dict[str, tuple[str, str]] = {}
    issues: list[IntegrityIssue] = []
    expanded = 0
    for key, item in state.items():
        chunks = getattr(item, "chunks", None)
        properties = getattr(item, "properties", None)
        if chunks is None or properties is None or not isinstance(key, str):
            continue  # bytes items (_extra_state, RNG) and anything that is not a tensor
        if not is_model_key(key):
            continue  # optimizer, RNG and other non-model tensors
        size, dtype = _size_and_dtype(metadata_file, key, item)
        template = KeyTemplate.of(key, len(size))
        inner = size[template.axes :]
        for chunk in chunks:
            offsets = _sizes(getattr(chunk, "offsets", None))
            sizes = _sizes(getattr(chunk, "sizes", None))
            if offsets is None or sizes is None or not len(offsets) == len(sizes) == len(size):
                raise InputError(metadata_file, f"{key}: malformed chunk offsets or sizes")
            if any(o + n > d for o, n, d in zip(offsets, sizes, size, strict=True)):
                raise InputError(
                    metadata_file, f"chunk {list(offsets)}+{list(sizes)} lies outside {key}"
                )
            where = locations.get((key, offsets))
            if where is None:
                raise InputError(metadata_file, f"no storage entry for chunk {offsets} of {key}")
            length = getattr(where, "length", None)
            if isinstance(length, int) and math.prod(sizes) * dtype.itemsize > length:
                raise InputError(  # a torch.save blob holds at least the raw element bytes
                    metadata_file,
                    f"chunk {list(offsets)} of {key} has {math.prod(sizes)} elements, "
                    f"more than its {length} stored bytes can hold",
                )
            expanded += math.prod(sizes[: template.axes])
            if expanded > MAX_TENSORS:
                raise InputError(metadata_file, f"expands to more than {MAX_TENSORS} tensors")
            spans = [range(offsets[a], offsets[a] + sizes[a]) for a in range(template.axes)]
            for fixed in itertools.product(*spans):
                name, half = template.name(fixed)
                plan = halves.setdefault(name, {}).get(half)
                if plan is None:
                    plan = _Plan(key, dtype, inner)
                    halves[name][half] = plan
                elif plan.key != key:
                    duplicates.setdefault(name, (plan.key, key))
                    continue
                plan.pieces.append(_piece(where, offsets, sizes, fixed, metadata_file, key))
    wrapper = wrapper_prefix(halves)
    if wrapper:  # a vision-language model: its language model under a prefix of its own
        halves = {name.removeprefix(wrapper): by_half for name, by_half in halves.items()}
    plans: dict[str, _Plan] = {}
    for name, by_half in sorted(halves.items()):
        plans[name] = _join_parts(name, by_half, issues)
        if name in EMBEDDING_NAMES and plans[name].shape:
            plans[name].rows = unpadded_rows(config, plans[name].shape[0])
    issues.extend(
        IntegrityIssue(
            "duplicate-tensor", name, f"{first} and {second} both map to {name}; {first} is used"
        )
        for name, (first, second) in sorted(duplicates.items())
    )
    issues.extend(_coverage_issues(plans))
    return plans, issues


def _size_and_dtype(metadata_file: Path, key: str, item: Any) -> tuple[tuple[int, ...], TorchDType]:
    """A model tensor's size and dtype as the index states them, its key spelled as a writer
    spells one (:func:`odd_number`)."""
    odd = odd_number(key)
    if odd is not None:
        raise InputError(
            metadata_file,
            f"{shown(key)} spells the number {shown(odd)} as no writer does, which reads as "
            "another key's (ambiguous)",
        )
    size = _sizes(getattr(item, "size", None))
    dtype = getattr(getattr(item, "properties", None), "dtype", None)
    if size is None or not isinstance(getattr(item, "chunks", None), (list, tuple)):
        raise InputError(metadata_file, f"{key}: malformed size or chunk list")
    if not isinstance(dtype, TorchDType):
        raise InputError(metadata_file, f"{key}: dtype {shown(dtype)} is not a torch dtype")
    return size, dtype


def _piece(
    where: Any,
    offsets: tuple[int, ...],
    sizes: tuple[int, ...],
    fixed: tuple[int, ...],
    metadata_file: Path,
    key: str,
) -> _Piece:
    relative = getattr(where, "relative_path", "")
    if not inside(relative):
        raise InputError(
            metadata_file, f"chunk of {key} points to {shown(relative)}, outside the dir"
        )
    if getattr(where, "transform_descriptors", None):
        raise InputError(metadata_file, f"chunk of {key} is stored transformed (unsupported)")
    span = _sizes((getattr(where, "offset", None), getattr(where, "length", None)))
    if span is None:
        raise InputError(metadata_file, f"chunk of {key} has no valid byte range in {relative}")
    return _Piece(relative, span[0], span[1], offsets, sizes, fixed)


def _join_parts(name: str, by_part: dict[str | None, _Plan], issues: list[IntegrityIssue]) -> _Plan:
    """One plan from the row parts of a split tensor, stacked in their row order
    (:func:`~mtpcheck.formats.torch_dist_keys.row_part_order`)."""
    if None in by_part:
        return by_part[None]
    parts = [p for p in by_part if p is not None]  # every key: None is not among them
    order = row_part_order(parts)
    first = next(iter(by_part.values()))
    if order is None:
        issues.append(
            IntegrityIssue("split-tensor-incomplete", name, f"parts {sorted(parts)} of {name}")
        )
        return first
    plans = [by_part[p] for p in order]
    head = plans[0]
    if any(p.dtype != head.dtype or p.shape[1:] != head.shape[1:] or not p.shape for p in plans):
        keys = " vs ".join(p.key for p in plans)
        issues.append(IntegrityIssue("split-tensor-mismatch", name, keys))
        return head
    pieces: list[_Piece] = []
    shift = 0
    for plan in plans:
        pieces += [
            _Piece(p.file, p.offset, p.length, p.chunk_offsets, p.chunk_sizes, p.fixed, shift)
            for p in plan.pieces
        ]
        shift += plan.shape[0]
    return _Plan(head.key, head.dtype, (shift, *head.shape[1:]), pieces)


def _covered(plan: _Plan) -> int:
    return sum(math.prod(p.chunk_sizes[len(p.fixed) :]) for p in plan.pieces)


def _coverage_issues(plans: Mapping[str, _Plan]) -> list[IntegrityIssue]:
    """Tensors whose stored chunks do not add up to the whole tensor, or share stored bytes
    (they are unreadable: a tensor is assembled only from chunks that tile it, each from bytes
    of its own, so what it costs is bounded by the bytes stored)."""
    issues = [
        IntegrityIssue(
            "incomplete-tensor",
            name,
            f"{name}: stored chunks hold {_covered(plan)} of {math.prod(plan.shape)} elements",
        )
        for name, plan in plans.items()
        if _covered(plan) != math.prod(plan.shape)
    ]
    issues += [
        IntegrityIssue("incomplete-tensor", name, f"{name}: two chunks name the same stored bytes")
        for name, plan in plans.items()
        if _bytes_shared(plan)
    ]
    return issues


def _bytes_shared(plan: _Plan) -> bool:
    """Whether two of the plan's chunks lie on the same bytes of a file."""
    spans = sorted((p.file, p.offset, p.offset + p.length) for p in plan.pieces)
    return any(a[0] == b[0] and b[1] < a[2] for a, b in itertools.pairwise(spans))


def _sizes(value: Any) -> tuple[int, ...] | None:
    """``value`` (a torch.Size, tuple or list) as non-negative ints; None when it is not one."""
    if not isinstance(value, (tuple, list)):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return tuple(value)


def _tensor_metas(
    directory: Path, plans: Mapping[str, _Plan]
) -> tuple[dict[str, TensorMeta], list[IntegrityIssue]]:
    sizes: dict[str, int] = {}
    for plan in plans.values():
        for piece in plan.pieces:
            if piece.file not in sizes:
                try:
                    st = os.stat(directory / piece.file)
                except FileNotFoundError as e:
                    raise InputError(
                        directory / piece.file, "named in .metadata, but the file is missing"
                    ) from e
                except OSError as e:
                    raise InputError(directory / piece.file, e.strerror or str(e)) from e
                if not stat.S_ISREG(st.st_mode):
                    raise InputError(directory / piece.file, "named in .metadata, but not a file")
                sizes[piece.file] = st.st_size
    cut: dict[str, list[str]] = {}
    tensors: dict[str, TensorMeta] = {}
    for name, plan in plans.items():
        past = sorted({p.file for p in plan.pieces if p.offset + p.length > sizes[p.file]})
        for file in past:
            cut.setdefault(file, []).append(name)
        shape = plan.shape if plan.rows is None else (plan.rows, *plan.shape[1:])
        tensors[name] = TensorMeta(
            name=name,
            dtype=plan.dtype.code,
            shape=tuple(shape),
            file=str(directory / plan.pieces[0].file),
            offset=0,
            nbytes=math.prod(shape) * plan.dtype.itemsize,
            readable=not past and _covered(plan) == math.prod(plan.shape),
        )
    issues = [
        IntegrityIssue(
            "chunk-out-of-range",
            file,
            f"{file} is {sizes[file]} bytes, but chunks of {len(names)} tensors end past it "
            f"(e.g. {names[0]})",
        )
        for file, names in sorted(cut.items())
    ]
    return tensors, issues


# --- reading ------------------------------------------------------------------------------


def _assemble(directory: Path, plan: _Plan) -> Any:
    """The tensor's elements (:func:`~mtpcheck.formats.torch_save_file.elements_of`),
    assembled from its chunks wherever they lie."""
    import numpy as np

    from mtpcheck.formats.torch_pickle import element_type

    width = plan.dtype.itemsize
    out: Any = None
    written: Any = None
    for piece in plan.pieces:
        path = directory / piece.file
        chunk = _chunk_elements(path, piece, plan)
        n = len(piece.fixed)
        if n:
            chunk = chunk[
                tuple(f - o for f, o in zip(piece.fixed, piece.chunk_offsets[:n], strict=True))
            ]
        if len(plan.pieces) == 1 and tuple(chunk.shape) == plan.shape:
            out = chunk
            break
        if out is None:
            out = np.zeros(plan.shape, dtype=element_type(width))
            written = np.zeros(plan.shape, dtype=bool)
        region = _region(piece)
        if written[region].any():  # chunks that overlap would leave other elements unset
            raise InputError(path, f"chunks of {plan.key} overlap")
        written[region] = True
        out[region] = chunk
    if out is None:
        out = np.zeros(plan.shape, dtype=element_type(width))
    return out if plan.rows is None else out[: plan.rows]


def _chunk_elements(path: Path, piece: _Piece, plan: _Plan) -> Any:
    """The elements of one stored chunk, shaped as the chunk."""
    from mtpcheck.formats.safe_pickle import load_torch_file

    chunk = load_torch_file(path, window=(piece.offset, piece.length))
    if not isinstance(chunk, StoredTensor) or chunk.numel != math.prod(piece.chunk_sizes):
        raise InputError(path, f"chunk at byte {piece.offset} is not the expected tensor")
    if chunk.dtype != plan.dtype.code:
        raise InputError(path, f"chunk of {plan.key} is {chunk.dtype}, expected {plan.dtype}")
    try:
        return chunk.elements().reshape(piece.chunk_sizes)
    except TorchReadError as e:
        raise InputError(path, f"chunk at byte {piece.offset}: {e}") from e


def _row_band_spans(directory: Path, plan: _Plan) -> list[ByteSpan] | None:
    """The tensor's bytes as byte ranges of the data files, in C order; None unless every
    piece is a plain tensor record of the plan's dtype whose part of the tensor is whole rows,
    the pieces tiling the rows exactly (then :func:`_assemble` does)."""
    from mtpcheck.formats.torch_save_record import locate_tensor

    dtype = plan.dtype.code
    width = plan.dtype.itemsize
    row_bytes = math.prod(plan.shape[1:]) * width
    bands: list[tuple[int, ByteSpan]] = []
    descriptors: dict[str, int] = {}
    try:
        for piece in plan.pieces:
            fd = descriptors.get(piece.file)
            if fd is None:
                fd = descriptors[piece.file] = os.open(directory / piece.file, os.O_RDONLY)
            raw = locate_tensor(fd, piece.offset, piece.length)
            n = len(piece.fixed)
            inner = piece.chunk_sizes[n:]
            if (
                raw is None
                or raw.dtype != dtype
                or math.prod(raw.shape) != math.prod(piece.chunk_sizes)
            ):
                return None
            if not plan.shape or tuple(inner[1:]) != tuple(plan.shape[1:]):
                if len(plan.pieces) != 1 or tuple(inner) != plan.shape:
                    return None
            skip = 0  # elements of the chunk before the layer/expert this tensor takes
            for axis, index in enumerate(piece.fixed):
                skip = skip * piece.chunk_sizes[axis] + index - piece.chunk_offsets[axis]
            skip *= math.prod(inner)
            start_row = (piece.chunk_offsets[n] + piece.row_shift) if inner else 0
            length = math.prod(inner) * width
            span = ByteSpan(str(directory / piece.file), raw.offset + skip * width, length)
            bands.append((start_row, span))
    except OSError:
        return None  # _assemble reports the file and the reason
    finally:
        for fd in descriptors.values():
            os.close(fd)
    bands.sort(key=lambda band: band[0])
    row = 0
    for start_row, span in bands:
        if start_row != row or (row_bytes and span.length % row_bytes):
            return None
        row += span.length // row_bytes if row_bytes else 1
    if plan.shape and row != plan.shape[0]:
        return None
    spans = [span for _, span in bands]
    return spans if plan.rows is None else slice_spans(spans, 0, plan.rows * row_bytes)


def _region(piece: _Piece) -> tuple[slice, ...]:
    """Where a chunk (minus its fixed leading axes) lands in the canonical tensor."""
    n = len(piece.fixed)
    starts = list(piece.chunk_offsets[n:])
    if starts:
        starts[0] += piece.row_shift
    return tuple(
        slice(start, start + size)
        for start, size in zip(starts, piece.chunk_sizes[n:], strict=True)
    )
