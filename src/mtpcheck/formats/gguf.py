"""GGUF files (llama.cpp), read from their documented layout without loading tensor data.

A GGUF file is a little-endian header: the magic ``GGUF``, a version (2 or 3), the tensor and
metadata counts, the metadata key/values, then one record per tensor (name, dimensions
innermost first, ``ggml_type``, offset into the data section), the data section starting at
the next multiple of ``general.alignment`` (32 by default). Only the header is read on open;
a tensor's bytes are read at its offset.

The metadata becomes the checkpoint's config: every key as it stands, plus ``model_type``
``gguf``, the ``architecture``, ``quantization_config`` ``{"quant_method": "gguf"}`` (each
tensor's ggml type is its own declaration), and ``block_count`` / ``nextn_predict_layers``
read from the architecture's own keys (``glm4moe.block_count``), with ``num_hidden_layers``
the blocks that are not nextn layers. Shapes are given outermost first, as torch and
safetensors give them.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from mtpcheck.dtypes import DTYPES
from mtpcheck.errors import InputError, shown
from mtpcheck.formats.chunked_read import read_tensor_chunks
from mtpcheck.model import CheckpointData, IntegrityIssue, Naming, TensorMeta
from mtpcheck.units import first_few

FORMAT = "gguf"
MAGIC = b"GGUF"
SUFFIX = ".gguf"
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 24
"""A key or string value longer than this is taken as a corrupt header."""

GGML_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    30: "BF16",
}
"""``ggml_type`` ids (``ggml.h``) of the types the dtype registry knows, by its codes."""

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALARS |= {11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufCheckpoint(CheckpointData):
    """An opened GGUF file."""

    cross_checked: str = "a GGUF header"
    format: str = FORMAT
    naming: Naming = Naming.GGUF
    drafts_beside: tuple[str, ...] | None = None
    """For a file declaring no nextn layer: the ``mtp-*.gguf`` drafts in its directory."""
    main_model_elsewhere: str = ""
    """For a ``--mtp`` draft file holding no main block: where its main model is."""

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes as the file holds them."""
        return read_tensor_chunks(self.tensors[name], chunk_bytes)


class _Header:
    """Sequential reads of a GGUF header, each failure an :class:`InputError` on the file."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise InputError(self.path, "file ends inside the GGUF header (truncated?)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise InputError(self.path, f"a GGUF header string claims {n} bytes (corrupt header)")
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(self.path, "a GGUF header string is not UTF-8") from e

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if count > MAX_STRING:
                raise InputError(self.path, f"a GGUF array claims {count} items (corrupt header)")
            return [self.value(inner) for _ in range(count)]
        raise InputError(self.path, f"unknown GGUF metadata value type {kind}")


@dataclass(frozen=True)
class _File:
    """The header of one GGUF file: its metadata and tensors (absolute offsets)."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorMeta]

    @property
    def unreadable(self) -> list[str]:
        return sorted(n for n, m in self.tensors.items() if not m.readable)


def _read_file(path: Path) -> _File:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = _Header(f, path)
            if header.take(4) != MAGIC:
                raise InputError(path, "not a GGUF file (no GGUF magic)")
            version = header.unpack("<I")
            if version not in (2, 3):
                raise InputError(path, f"GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = header.unpack("<Q"), header.unpack("<Q")
            metadata = {header.string(): header.value(header.unpack("<I")) for _ in range(n_kv)}
            records = [_tensor_record(header) for _ in range(n_tensors)]
            end = f.tell()
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise InputError(
            path, f"general.alignment {shown(alignment, 200)} is not a positive integer"
        )
    data_start = -(-end // alignment) * alignment
    tensors: dict[str, TensorMeta] = {}
    for name, dims, type_id, offset in records:
        if name in tensors:
            raise InputError(
                path, f"tensor {shown(name, 200)} is declared twice in the GGUF header"
            )
        tensors[name] = _meta(path, name, dims, type_id, data_start + offset, size)
    return _File(path, metadata, tensors)


def _truncated(file: _File) -> tuple[IntegrityIssue, ...]:
    cut = file.unreadable
    if not cut:
        return ()
    few = first_few(cut, 3, counted=False)
    name = file.path.name
    message = f"{name} ends before the bytes of {len(cut)} tensor(s) ({few})"
    return (IntegrityIssue("truncated-file", name, message),)


DRAFT_PREFIX = "mtp-"
"""llama.cpp's converter names a ``--mtp`` draft file ``mtp-<model>.gguf``."""
SPLIT_NAME = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")
"""gguf-py's shard names (``SHARD_NAME_FORMAT``): ``NAME-00001-of-00003.gguf``."""


def _shards(path: Path) -> list[Path] | None:
    """Every shard of the split set ``path`` names, in order; None for a single file."""
    m = SPLIT_NAME.fullmatch(path.name)
    if m is None:
        return None
    count = int(m["count"])
    return [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _split_issues(files: list[_File], shards: list[Path]) -> list[IntegrityIssue]:
    issues: list[IntegrityIssue] = []
    total = sum(len(f.tensors) for f in files)
    for no, file in enumerate(files):
        count, at = file.metadata.get("split.count"), file.metadata.get("split.no")
        if (count, at) != (len(shards), shards.index(file.path)):
            issues.append(
                IntegrityIssue(
                    "split-mismatch",
                    file.path.name,
                    f"{file.path.name} says it is shard {at} of {count}; its name says "
                    f"{shards.index(file.path)} of {len(shards)}",
                )
            )
        declared = file.metadata.get("split.tensors.count")
        if (
            no == 0
            and isinstance(declared, int)
            and declared != total
            and len(files) == len(shards)
        ):
            issues.append(
                IntegrityIssue(
                    "split-tensor-count",
                    file.path.name,
                    f"split.tensors.count is {declared}; the {len(shards)} shards hold {total}",
                )
            )
    return issues


def read_gguf(path: Path) -> GgufCheckpoint:
    """Open one GGUF file, or the split set it is a shard of: headers only."""
    shards = _shards(path)
    if shards is None:
        file = _read_file(path)
        return _checkpoint(path, [file], list(_truncated(file)), "a GGUF header")

    present = [s for s in shards if s.exists()]
    files = [_read_file(s) for s in present]
    issues = [
        IntegrityIssue("missing-shard", s.name, f"{s.name} of the split set is missing")
        for s in shards
        if not s.exists()
    ]
    issues += _split_issues(files, shards)
    for file in files:
        issues += _truncated(file)
    return _checkpoint(path, files, issues, f"{len(shards)} GGUF shard headers")


def _checkpoint(
    path: Path, files: list[_File], issues: list[IntegrityIssue], checked: str
) -> GgufCheckpoint:
    tensors: dict[str, TensorMeta] = {}
    for file in files:
        for name, meta in file.tensors.items():
            if name in tensors:
                raise InputError(
                    file.path,
                    f"tensor {shown(name, 200)} is also in {Path(tensors[name].file).name}",
                )
            tensors[name] = meta
    first = next((f for f in files if not f.metadata.get("split.no")), files[0] if files else None)
    if first is None:
        raise InputError(path, "no shard of the split set is present")
    config = gguf_config(first.metadata)
    drafts = None
    if not config.get("nextn_predict_layers") and not path.name.startswith(DRAFT_PREFIX):
        drafts = tuple(  # where llama.cpp's --mtp would have put a draft
            sorted(f.name for f in path.parent.glob(DRAFT_PREFIX + "*" + SUFFIX) if _is_first(f))
        )
    elsewhere = ""
    if path.name.startswith(DRAFT_PREFIX) and not any(n.startswith("blk.0.") for n in tensors):
        elsewhere = "a draft llama.cpp's --mtp split off its target, which holds the main model"
    return GgufCheckpoint(
        path=str(path),
        config=config,
        drafts_beside=drafts,
        main_model_elsewhere=elsewhere,
        config_path=str(first.path),
        tensors=dict(sorted(tensors.items())),
        issues=tuple(issues),
        cross_checked=checked,
    )


def _tensor_record(header: _Header) -> tuple[str, tuple[int, ...], int, int]:
    name = header.string()
    n_dims = header.unpack("<I")
    if n_dims > 8:
        raise InputError(header.path, f"tensor {shown(name, 200)} claims {n_dims} dimensions")
    dims = tuple(header.unpack("<Q") for _ in range(n_dims))
    return name, dims, header.unpack("<I"), header.unpack("<Q")


def _meta(
    path: Path, name: str, dims: tuple[int, ...], type_id: int, offset: int, size: int
) -> TensorMeta:
    code = GGML_TYPES.get(type_id)
    if code is None:
        raise InputError(
            path, f"tensor {shown(name, 200)} has ggml_type {type_id}, which mtpcheck lacks"
        )
    shape = tuple(reversed(dims))  # GGUF lists the innermost dimension first
    numel = 1
    for d in shape:
        numel *= d
    nbytes = DTYPES[code].nbytes(numel)
    if nbytes is None:
        raise InputError(
            path, f"tensor {shown(name, 200)}: {numel} elements do not fill {code} blocks"
        )
    return TensorMeta(name, code, shape, str(path), offset, nbytes, offset + nbytes <= size)


def gguf_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata as a config: every key, plus the counts the MTP checks read."""
    arch = metadata.get("general.architecture")
    config: dict[str, Any] = {
        **metadata,
        "model_type": FORMAT,
        "architecture": arch,
        "quantization_config": {"quant_method": FORMAT},  # types are per tensor, in the header
    }
    if isinstance(arch, str):
        blocks = metadata.get(f"{arch}.block_count")
        nextn = metadata.get(f"{arch}.nextn_predict_layers")
        if isinstance(blocks, int):
            config["block_count"] = blocks
            config["num_hidden_layers"] = blocks - (nextn if isinstance(nextn, int) else 0)
        if isinstance(nextn, int):
            config["nextn_predict_layers"] = nextn
        width = metadata.get(f"{arch}.embedding_length")
        if isinstance(width, int):
            config["hidden_size"] = width
    return config


SHARED = ("token_embd.weight", "output.weight", "output_norm.weight")
"""What a draft repeats of its target (the converter's ``--mtp`` keeps them)."""


def _is_first(path: Path) -> bool:
    m = SPLIT_NAME.fullmatch(path.name)
    return m is None or int(m["no"]) == 1


def _models(directory: Path) -> list[Path]:
    """One path per model in ``directory``: a single file, or the first shard of a set."""
    models: dict[str, Path] = {}
    for file in sorted(directory.glob("*" + SUFFIX)):
        m = SPLIT_NAME.fullmatch(file.name)
        models.setdefault(m["stem"] if m else file.stem, file)
    return list(models.values())


def _pair_issues(target: GgufCheckpoint, draft: GgufCheckpoint) -> list[IntegrityIssue]:
    """Where ``draft`` does not fit ``target``: a different model, vocabulary or width, or
    its nextn layer not where the target's main blocks end."""
    name = Path(draft.path).name
    tc, dc = target.config, draft.config
    problems = [
        f"{key} {shown(dc.get(key), 200)}, the target's is {shown(tc.get(key), 200)}"
        for key in ("architecture", "hidden_size")
        if tc.get(key) != dc.get(key)
    ]
    if not dc.get("nextn_predict_layers"):
        problems.append("it declares no nextn layer")
    elif dc.get("num_hidden_layers") != tc.get("num_hidden_layers"):
        problems.append(
            f"its nextn layer follows {dc.get('num_hidden_layers')} main blocks; "
            f"the target has {tc.get('num_hidden_layers')}"
        )
    vocab = "tokenizer.ggml.tokens"
    if vocab in tc and vocab in dc and tc[vocab] != dc[vocab]:
        problems.append(f"its vocabulary ({len(dc[vocab])} tokens) is not the target's")
    for shared in SHARED:
        a, b = target.tensors.get(shared), draft.tensors.get(shared)
        if a is not None and b is not None and (a.dtype, a.shape) != (b.dtype, b.shape):
            problems.append(
                f"{shared} is {b.dtype}{list(b.shape)}, the target's {a.dtype}{list(a.shape)}"
            )
    return [IntegrityIssue("draft-mismatch", name, f"the draft {name}: {p}") for p in problems]


def open_pair(target_path: Path, draft_path: Path) -> GgufCheckpoint:
    """A target GGUF and the MTP draft split off from it (``--mtp``), as one checkpoint: the
    target's tensors and the draft's nextn blocks, the draft's declaration of them, and a
    finding for every way the draft does not fit the target."""
    target, draft = read_gguf(target_path), read_gguf(draft_path)
    if target.config.get("nextn_predict_layers"):
        raise InputError(
            target_path, "already holds its nextn layer; --draft is for a target written --no-mtp"
        )
    hidden = draft.config.get("num_hidden_layers")
    own = {
        n: m
        for n, m in draft.tensors.items()
        if isinstance(hidden, int) and n.startswith("blk.") and int(n.split(".")[1]) >= hidden
    }
    config = dict(target.config)
    for key in ("nextn_predict_layers", "block_count"):
        if key in draft.config:
            config[key] = draft.config[key]
    return replace(
        target,
        config=config,
        tensors=dict(sorted({**target.tensors, **own}.items())),
        issues=(*target.issues, *draft.issues, *_pair_issues(target, draft)),
        cross_checked=f"{target.cross_checked} and its draft {Path(draft.path).name}",
        drafts_beside=None,
    )


def open_target_and_draft(target: Path, draft: Path) -> GgufCheckpoint:
    """``inspect TARGET --draft DRAFT``: both must be GGUF files (or a shard of a set)."""
    for path in (target, draft):
        if not path.is_file():
            reason = "is a directory" if path.is_dir() else "no such file"
            raise InputError(path, f"{reason}: --draft pairs two GGUF files")
    return open_pair(target, draft)


class GgufReader:
    """Reader for GGUF files: one file, a split set (any shard, or the directory holding it),
    or a directory holding a target and its ``mtp-`` draft (and no safetensors)."""

    name = FORMAT

    def sniff(self, path: Path) -> bool:
        """A GGUF file (by suffix or magic), or a directory of GGUF files without safetensors
        shards."""
        if path.is_file():
            return path.suffix == SUFFIX or _has_magic(path)
        if not path.is_dir() or any(path.glob("*.safetensors*")):
            return False  # a safetensors checkpoint that ships a GGUF too is read as such
        return bool(list(path.glob("*" + SUFFIX)))

    def open(self, path: Path) -> GgufCheckpoint:
        """Open the GGUF file at ``path``, or the model (and draft) a directory holds."""
        if not path.is_dir():
            return read_gguf(path)
        models = _models(path)
        drafts = [m for m in models if m.name.startswith(DRAFT_PREFIX)]
        targets = [m for m in models if not m.name.startswith(DRAFT_PREFIX)]
        if len(models) == 1:
            return read_gguf(models[0])
        if len(targets) == 1 and len(drafts) == 1:
            return open_pair(targets[0], drafts[0])
        raise InputError(path, f"holds {len(models)} GGUF models; name the one to open")

    def open_with_draft(self, target: Path, draft: Path) -> GgufCheckpoint:
        """``inspect TARGET --draft DRAFT``: a target and the draft split off from it."""
        return open_target_and_draft(target, draft)


def _has_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False
