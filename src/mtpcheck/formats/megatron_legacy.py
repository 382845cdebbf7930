"""Megatron-LM legacy checkpoints: one ``model_optim_rng.pt`` per model-parallel rank.

Accepted inputs: a save root with ``latest_checkpointed_iteration.txt``, an iteration directory
(``iter_XXXXXXX/`` or ``release/``) holding ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``, or a
rank directory or rank file inside one (the whole iteration is read). Each rank file is a
``torch.save`` of ``{'args', 'model' (or 'model0', 'model1', ... with virtual pipelining), ...}``;
it is loaded with the safe loader, and a tensor's bytes are read from it by position only when
the tensor is read.

The directory name's second field is the pipeline stage when ``args`` declare
``pipeline_model_parallel_size > 1`` and the expert rank otherwise (``mp_rank_TT_EEE``).
Shards are joined into the canonical names of :mod:`mtpcheck.formats.megatron_common`:

* layer indices are stage-local; stage ``(v, p)`` (virtual chunk, pipeline stage, in that
  order) is offset by the number of decoder layers of all earlier stages, counted from the files;
  MTP layers keep their index (megatron-core builds them all on the last stage);
* experts ``mlp.experts.local_experts.{j}`` and TE-grouped ``mlp.experts.linear_fc1.weight{j}``
  become ``mlp.experts.local_experts.{ep_rank * local_experts + j}``; non-expert tensors are
  taken from expert rank 0, and a tensor held by several pipeline stages (the embedding copy of
  the MTP stage) from the first;
* tensor-parallel shards: ``linear_qkv``, ``linear_q_up_proj``, ``linear_kv_up_proj``,
  ``linear_q_proj``, ``eh_proj``, the word embedding and ``output_layer`` are concatenated on
  dim 0; ``linear_proj`` and ``linear_fc2`` weights on dim 1; a gated (SwiGLU) ``linear_fc1``
  holds ``[gate_r; up_r]`` per rank and becomes ``[gate_0, gate_1, ...; up_0, up_1, ...]``;
  everything else (norms, router, row-parallel biases, MLA down projections) is replicated and
  taken from rank 0, after checking that every rank holds the same bytes (a tensor whose ranks
  differ has an unknown split and raises :class:`InputError` when read). Experts follow
  ``expert_tensor_parallel_size`` (default: the TP size; with 1 they are replicated across TP
  ranks); the old fused GroupedMLP (``mlp.experts.weight1``) is refused when split;
* the word embedding and ``output_layer`` keep only ``vocab_size`` rows when ``args`` declare a
  larger ``padded_vocab_size``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, shown
from mtpcheck.formats.megatron_common import (
    EMBEDDING_NAMES,
    MODEL_TYPE,
    MegatronReaderBase,
    args_config,
    canonical_name,
    default_layer_count,
    is_model_key,
    odd_number,
    tensor_chunks,
    unpadded_rows,
)
from mtpcheck.formats.torch_dist_keys import DECODER_LAYER
from mtpcheck.formats.torch_pickle import StoredTensor, TorchReadError
from mtpcheck.model import CheckpointData, Naming, TensorMeta

FORMAT = "megatron-legacy"
RANK_FILE = "model_optim_rng.pt"
_VIRTUAL_CHUNK = r"model(0|[1-9][0-9]{0,5})"
"""A virtual pipeline chunk's state dict key (``model0``, ``model1``, ...), ASCII digits only."""
_RANK_DIR = re.compile(r"^mp_rank_([0-9]{2,6})(?:_([0-9]{3,6}))?(?:_([0-9]{3,6}))?$")
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")
_GROUPED_EXPERT = re.compile(r"\.mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$")
_COLUMN_MODULES = {"linear_qkv", "linear_q_up_proj", "linear_kv_up_proj", "linear_q_proj"}


@dataclass
class _Entry:
    """The tensor-parallel shards of one canonical tensor and how to join them."""

    group: tuple[int, int, int]
    kind: str
    shards: dict[int, Any] = field(default_factory=dict)
    files: dict[int, str] = field(default_factory=dict)
    rows: int | None = None


@dataclass(frozen=True)
class MegatronLegacyCheckpoint(CheckpointData):
    """An opened legacy checkpoint; tensors are joined from their shards when read."""

    entries: Mapping[str, _Entry] = field(repr=False)
    file_sizes: Mapping[str, int] = field(repr=False, default_factory=dict)
    """Size of each rank file when it was opened (a changed one is being written)."""
    cross_checked: str = "the rank files' shards"
    format: str = FORMAT
    naming: Naming = Naming.MEGATRON

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes, its tensor-parallel shards joined (the rank files must not have
        changed since they were opened)."""
        entry = self.entries[name]
        _check_unchanged(entry.files.values(), self.file_sizes)
        yield from tensor_chunks(_join(name, entry), chunk_bytes)


class MegatronLegacyReader(MegatronReaderBase):
    """Reader for Megatron-LM legacy (``mp_rank_*``) checkpoints."""

    name = FORMAT
    what = "Megatron legacy"
    broken_tracker_sniffs = False

    def looks(self, directory: Path) -> bool:
        """An ``mp_rank_*`` directory in ``directory``."""
        try:
            return any(p.is_dir() and _RANK_DIR.match(p.name) for p in directory.iterdir())
        except OSError:
            return False

    def sniff(self, path: Path) -> bool:
        """A rank file in its ``mp_rank_*`` directory, such a directory, or a directory holding
        (an iteration of) a legacy checkpoint."""
        if path.is_file():
            return path.name == RANK_FILE and bool(_RANK_DIR.match(path.parent.name))
        if not path.is_dir():
            return False
        return bool(_RANK_DIR.match(path.name)) or self.sniff_dir(path)

    def open(self, path: Path) -> MegatronLegacyCheckpoint:
        """Open the checkpoint at ``path`` (a save root, an iteration, a rank directory or
        file)."""
        start = path.parent if path.is_file() else path
        if _RANK_DIR.match(start.name):
            start = start.parent
        directory = self.iteration_dir(path, start)
        rank_dirs = sorted(p.name for p in directory.iterdir() if _RANK_DIR.match(p.name))
        file_sizes: dict[str, int] = {}
        first = _load_rank(directory / rank_dirs[0], self.trust_pickle, file_sizes)
        config = args_config(first.get("args"))
        config["model_type"] = MODEL_TYPE
        sizes = _parallel_sizes(config, rank_dirs)
        layout = _assign_ranks(directory, rank_dirs, sizes)
        contents = {
            coords: (
                first
                if name == rank_dirs[0]
                else _load_rank(directory / name, self.trust_pickle, file_sizes)
            )
            for coords, name in layout.items()
        }
        entries = _collect(directory, layout, contents, config, sizes)
        tensors = _tensor_metas(entries, sizes[0])
        default_layer_count(config, tensors)
        return MegatronLegacyCheckpoint(
            path=str(path),
            config=config,
            config_path=str(directory / rank_dirs[0] / RANK_FILE),
            tensors=tensors,
            issues=(),
            entries=entries,
            file_sizes=file_sizes,
        )


def _load_rank(rank_dir: Path, trust_pickle: bool, file_sizes: dict[str, int]) -> dict[str, Any]:
    file = rank_dir / RANK_FILE
    if not file.is_file():
        raise InputError(rank_dir, f"no {RANK_FILE} in this rank directory")
    file_sizes[str(file)] = _size(file)
    from mtpcheck.formats.safe_pickle import load_torch_file  # only Megatron inputs need it

    content = load_torch_file(file, trust_pickle=trust_pickle)
    if not isinstance(content, dict):
        raise InputError(file, f"expected a dict, found {type(content).__name__}")
    return content


def _size(file: str | Path) -> int:
    try:
        return os.stat(file).st_size
    except OSError as e:
        raise InputError(file, e.strerror or str(e)) from e


def _check_unchanged(files: Iterable[str], file_sizes: Mapping[str, int]) -> None:
    """A rank file that changed size since it was opened is being written: an error before
    anything is read (a tensor read after it shrank is one too, :class:`Archive`)."""
    for file in sorted(set(files)):
        size = _size(file)
        if file in file_sizes and size != file_sizes[file]:
            raise InputError(
                file, f"changed since it was opened ({file_sizes[file]} bytes, now {size})"
            )


def _parallel_sizes(config: Mapping[str, Any], rank_dirs: list[str]) -> tuple[int, int, int]:
    """(TP, PP, EP) from args; what the directory names show fills in undeclared sizes."""
    fields = [_RANK_DIR.match(n).groups() for n in rank_dirs]  # type: ignore[union-attr]
    seen_tp = 1 + max(int(f[0]) for f in fields)
    seen_second = 1 + max(int(f[1] or 0) for f in fields)
    seen_third = 1 + max(int(f[2] or 0) for f in fields)

    def declared(key: str) -> int | None:
        value = config.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else None

    tp = declared("tensor_model_parallel_size") or seen_tp
    pp = declared("pipeline_model_parallel_size")
    ep = declared("expert_model_parallel_size")
    if pp is None:
        pp = 1 if ep is not None and ep > 1 and seen_third == 1 else seen_second
    if ep is None:
        ep = seen_third if seen_third > 1 else (seen_second if pp == 1 else 1)
    return tp, pp, ep


def _rank_dir_name(tp: int, pp: int, ep: int, sizes: tuple[int, int, int]) -> str:
    name = f"mp_rank_{tp:02d}"
    if sizes[1] > 1:
        name += f"_{pp:03d}"
    if sizes[2] > 1:
        name += f"_{ep:03d}"
    return name


def _assign_ranks(
    directory: Path, rank_dirs: list[str], sizes: tuple[int, int, int]
) -> dict[tuple[int, int, int], str]:
    tp_size, pp_size, ep_size = sizes
    if tp_size * pp_size * ep_size > max(1024, 4 * len(rank_dirs)):  # too many to name
        raise InputError(
            directory,
            f"args say TP={tp_size}, PP={pp_size}, EP={ep_size}: {tp_size * pp_size * ep_size} "
            f"rank directories, and {len(rank_dirs)} are here",
        )
    expected = {
        _rank_dir_name(t, p, e, sizes): (t, p, e)
        for t in range(tp_size)
        for p in range(pp_size)
        for e in range(ep_size)
    }
    missing = sorted(set(expected) - set(rank_dirs))
    if missing:
        raise InputError(
            directory,
            f"missing rank directory {missing[0]} ({len(missing)} of {len(expected)} missing; "
            f"args say TP={tp_size}, PP={pp_size}, EP={ep_size})",
        )
    extra = sorted(set(rank_dirs) - set(expected))
    if extra:
        raise InputError(
            directory,
            f"unexpected rank directory {extra[0]} for TP={tp_size}, PP={pp_size}, EP={ep_size}",
        )
    return {coords: name for name, coords in expected.items()}


def _model_chunks(content: Mapping[str, Any], where: Path) -> list[Mapping[str, Any]]:
    if isinstance(content.get("model"), Mapping):
        return [content["model"]]
    numbered = sorted(
        (int(k[5:]), v) for k, v in content.items() if re.fullmatch(_VIRTUAL_CHUNK, str(k))
    )
    if not numbered or not all(isinstance(v, Mapping) for _, v in numbered):
        raise InputError(where, "no 'model' state dict in this rank file")
    return [v for _, v in numbered]


def _kind(name: str, gated: bool, expert: bool, etp: int) -> str:
    """How the tensor-parallel shards of ``name`` are joined (see the module docstring)."""
    if expert and etp == 1:
        return "replicated"
    if name in EMBEDDING_NAMES or name.endswith(".eh_proj.weight"):
        return "dim0"
    module, _, param = name.rpartition(".")
    module = module.rpartition(".")[2]
    if module in _COLUMN_MODULES and param in ("weight", "bias"):
        return "dim0"
    if module == "linear_fc1" and param in ("weight", "bias"):
        return "gated" if gated else "dim0"
    if module in ("linear_proj", "linear_fc2") and param == "weight":
        return "dim1"
    return "replicated"


def _collect(
    directory: Path,
    layout: Mapping[tuple[int, int, int], str],
    contents: Mapping[tuple[int, int, int], dict[str, Any]],
    config: Mapping[str, Any],
    sizes: tuple[int, int, int],
) -> dict[str, _Entry]:
    tp_size, pp_size, ep_size = sizes
    gated = bool(config.get("swiglu") or config.get("gated_linear_unit"))
    if tp_size > 1 and "swiglu" not in config and "gated_linear_unit" not in config:
        raise InputError(
            directory,
            "args declare neither swiglu nor gated_linear_unit, so linear_fc1 shards cannot "
            "be joined",
        )
    etp = config.get("expert_tensor_parallel_size") or tp_size
    if etp not in (1, tp_size):
        raise InputError(directory, f"expert_tensor_parallel_size={etp} with TP={tp_size}")
    chunks = {c: _model_chunks(contents[c], directory / layout[c] / RANK_FILE) for c in contents}
    virtual = len(chunks[(0, 0, 0)])
    offsets: dict[tuple[int, int], int] = {}
    total = 0
    for v in range(virtual):
        for p in range(pp_size):
            offsets[(v, p)] = total
            local = chunks[(0, p, 0)][v] if v < len(chunks[(0, p, 0)]) else {}
            total += len({m.group(1) for k in local if (m := DECODER_LAYER.match(k))})
    num_experts = config.get("num_experts")
    per_rank = num_experts // ep_size if isinstance(num_experts, int) else None
    entries: dict[str, _Entry] = {}
    counted: dict[tuple[int, str], int] = {}
    by_stage = sorted(chunks.items(), key=lambda item: (item[0][1], item[0][2], item[0][0]))
    for (t, p, e), models in by_stage:
        for v, model in enumerate(models):
            for key, value in model.items():
                if not isinstance(value, StoredTensor) or not is_model_key(key):
                    continue
                expert = ".mlp.experts." in key
                if e > 0 and not expert:
                    continue
                if expert and max(ep_size, etp) > 1 and not _known_expert(key):
                    raise InputError(
                        directory / layout[(t, p, e)], f"{key}: unsupported expert layout"
                    )
                rank_file = directory / layout[(t, p, e)] / RANK_FILE
                odd = odd_number(key)
                if odd is not None:
                    raise InputError(
                        rank_file,
                        f"{shown(key)} spells the number {shown(odd)} as no writer does, "
                        "which reads as another key's (ambiguous)",
                    )
                held = per_rank or (_local_experts(model, key, counted) if expert else 0)
                name = _global_name(key, offsets[(v, p)], e, held)
                entry = entries.get(name)
                if entry is None:
                    kind = _kind(name, gated, expert, etp)
                    entry = entries[name] = _Entry((v, p, e), kind)
                if entry.group != (v, p, e):
                    continue  # a later pipeline stage's copy (e.g. the MTP stage's embedding)
                if t in entry.shards:
                    raise InputError(rank_file, f"two keys name {name} (ambiguous)")
                entry.shards[t] = value
                entry.files[t] = str(directory / layout[(t, p, e)] / RANK_FILE)
    for name, entry in entries.items():
        if name in EMBEDDING_NAMES:
            entry.rows = unpadded_rows(config, _full_shape(name, entry, tp_size)[0])
    return entries


def _known_expert(key: str) -> bool:
    """Per-expert keys (SequentialMLP or TE grouped); the old fused GroupedMLP is not."""
    return bool(_LOCAL_EXPERT.search(key) or _GROUPED_EXPERT.search(key))


def _local_experts(model: Mapping[str, Any], key: str, counted: dict[tuple[int, str], int]) -> int:
    """Experts held by this rank in the layer of ``key`` (when args lack num_experts)."""
    layer = key.split(".mlp.experts.", 1)[0] + ".mlp.experts."
    if (id(model), layer) not in counted:
        found = set()
        for other in model:
            if other.startswith(layer):
                if local := _LOCAL_EXPERT.search(other):
                    found.add(local.group(1))
                elif grouped := _GROUPED_EXPERT.search(other):
                    found.add(grouped.group(3))
        counted[(id(model), layer)] = len(found)
    return counted[(id(model), layer)]


def _global_name(key: str, layer_offset: int, ep_rank: int, per_rank: int) -> str:
    m = DECODER_LAYER.match(key)
    if m:
        key = f"decoder.layers.{int(m.group(1)) + layer_offset}.{key[m.end() :]}"
    m = _LOCAL_EXPERT.search(key)
    if m:
        index = ep_rank * per_rank + int(m.group(1))
        key = f"{key[: m.start()]}.mlp.experts.local_experts.{index}.{key[m.end() :]}"
    m = _GROUPED_EXPERT.search(key)
    if m:
        index = ep_rank * per_rank + int(m.group(3))
        key = f"{key[: m.start()]}.mlp.experts.local_experts.{index}.{m.group(1)}.{m.group(2)}"
    return canonical_name(key)


def _full_shape(name: str, entry: _Entry, tp_size: int) -> tuple[int, ...]:
    """Shape of the joined tensor; raises when shards are missing or do not fit together."""
    first = Path(next(iter(entry.files.values())))
    iteration = first.parent.parent
    missing = [t for t in range(tp_size) if t not in entry.shards]
    if missing:
        raise InputError(
            iteration, f"{name} is in {first.parent.name} but missing from TP rank {missing[0]}"
        )
    ref = entry.shards[0]
    for t in range(1, tp_size):
        other = entry.shards[t]
        if tuple(other.shape) != tuple(ref.shape) or other.dtype != ref.dtype:
            raise InputError(
                iteration,
                f"inconsistent shards of {name}: TP rank 0 {list(ref.shape)} {ref.dtype}, "
                f"TP rank {t} {list(other.shape)} {other.dtype}",
            )
    base = tuple(ref.shape)
    if entry.kind in ("dim0", "gated") and base:
        if entry.kind == "gated" and base[0] % 2:
            raise InputError(first, f"{name}: odd row count {base[0]} in a gated linear_fc1 shard")
        return (base[0] * tp_size, *base[1:])
    if entry.kind == "dim1" and len(base) >= 2:
        return (base[0], base[1] * tp_size, *base[2:])
    return base


def _tensor_metas(entries: Mapping[str, _Entry], tp_size: int) -> dict[str, TensorMeta]:
    tensors: dict[str, TensorMeta] = {}
    for name, entry in sorted(entries.items()):
        shape = _full_shape(name, entry, tp_size)
        if entry.rows is not None:
            shape = (entry.rows, *shape[1:])
        first = entry.shards[0]
        tensors[name] = TensorMeta(
            name=name,
            dtype=first.dtype,
            shape=shape,
            file=entry.files[0],
            offset=0,
            nbytes=math.prod(shape) * first.itemsize,
        )
    return tensors


def _join(name: str, entry: _Entry) -> Any:
    """The joined tensor's elements (numpy, of the element width; bytes never converted)."""
    import numpy as np

    shards = [_elements(entry, t) for t in sorted(entry.shards)]
    if entry.kind == "replicated":
        first = np.ascontiguousarray(shards[0]).reshape(-1).view(np.uint8)
        for t, other in enumerate(shards[1:], start=1):
            raw = np.ascontiguousarray(other).reshape(-1).view(np.uint8)
            if first.shape != raw.shape or not np.array_equal(first, raw):
                raise InputError(
                    entry.files[t],
                    f"{name} differs between TP ranks 0 and {t}, but mtpcheck knows it only as "
                    "a replicated tensor (unknown tensor-parallel layout)",
                )
        full = shards[0]
    elif len(shards) == 1:
        full = shards[0]
    elif entry.kind == "dim0":
        full = np.concatenate(shards, axis=0)
    elif entry.kind == "dim1":
        full = np.concatenate(shards, axis=1)
    else:
        half = shards[0].shape[0] // 2
        full = np.concatenate([s[:half] for s in shards] + [s[half:] for s in shards], axis=0)
    return full if entry.rows is None else full[: entry.rows]


def _elements(entry: _Entry, tp_rank: int) -> Any:
    try:
        return entry.shards[tp_rank].elements()
    except TorchReadError as e:
        raise InputError(entry.files[tp_rank], f"unreadable tensor ({e})") from e
