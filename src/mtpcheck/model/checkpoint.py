"""The checkpoint contract every format reader fulfils, and the optional abilities a reader's
checkpoint may add (byte spans, slices, positioned reads, prefetching)."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mtpcheck.model.tensors import ByteSpan, TensorMeta


@dataclass(frozen=True)
class IntegrityIssue:
    """A structural problem a reader found while opening a checkpoint (not fatal)."""

    kind: str
    """Short machine name, e.g. ``missing-shard`` or ``tensor-in-two-shards``."""
    subject: str
    message: str


class Naming(str, enum.Enum):
    """Which tensor names a checkpoint uses (what a cross-format comparison maps between)."""

    HF = "hf"
    """Hugging Face names (``model.layers.{k}.self_attn.q_proj.weight``)."""
    MEGATRON = "megatron"
    """megatron-core's ``GPTModel.state_dict()`` names (``decoder.layers.{k}...``)."""
    GGUF = "gguf"
    """llama.cpp's names (``blk.{k}.attn_q.weight``, ``blk.{n}.nextn.eh_proj.weight``)."""


@runtime_checkable
class Checkpoint(Protocol):
    """An opened checkpoint, whatever its on-disk format. Its data is read-only (readers
    return frozen dataclasses, :class:`~mtpcheck.model.CheckpointData`)."""

    @property
    def path(self) -> str:
        """Where the checkpoint is, as the user named it."""
        ...

    @property
    def format(self) -> str:
        """Format name, e.g. ``hf-safetensors``."""
        ...

    @property
    def naming(self) -> Naming:
        """Which tensor names the checkpoint uses."""
        ...

    @property
    def config(self) -> Mapping[str, Any]:
        """Parsed model config (``{}`` when the checkpoint ships none)."""
        ...

    @property
    def config_path(self) -> str | None:
        """The file the config was read from; None when there is none."""
        ...

    @property
    def tensors(self) -> Mapping[str, TensorMeta]:
        """Every tensor the checkpoint holds, by its native name."""
        ...

    @property
    def issues(self) -> tuple[IntegrityIssue, ...]:
        """The structural problems found while opening it."""
        ...

    @property
    def cross_checked(self) -> str:
        """What the reader checked against each other when it opened the checkpoint, in words
        (``headers and index``, ``a single header``): the integrity check's "consistent"
        line."""
        ...

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """Yield the raw bytes of tensor ``name`` in order, ``chunk_bytes`` at a time (the last
        chunk may be shorter)."""
        ...


def read_whole(ckpt: Checkpoint, name: str, chunk_bytes: int = 1 << 24) -> bytearray:
    """Tensor ``name``'s bytes in one writable buffer, ``chunk_bytes`` read at a time."""
    buf = bytearray(ckpt.tensors[name].nbytes)
    pos = 0
    for chunk in ckpt.read_chunks(name, chunk_bytes):
        buf[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    return buf


@runtime_checkable
class HasByteSpans(Protocol):
    """A checkpoint that can say where a tensor's bytes lie in its files (writers then copy
    them file to file, in the kernel)."""

    def byte_spans(self, name: str) -> list[ByteSpan] | None:
        """The tensor's bytes as file ranges in C order; None when they must be computed."""
        ...


@runtime_checkable
class ReadsSlices(Protocol):
    """Reads bytes ``start .. start + length`` of a tensor alone (one of stacked experts),
    chunked as ``read_chunks``."""

    def read_slice_chunks(self, name: str, start: int, length: int, size: int) -> Iterator[bytes]:
        """Bytes ``start .. start + length`` of tensor ``name``, ``size`` at a time."""
        ...


@runtime_checkable
class HasSpanReader(Protocol):
    """A checkpoint whose tensors lie at plain file offsets (``TensorMeta.file`` and
    ``offset``), read by positioned reads: the tensor matcher's fast path."""

    def span_reader(self) -> Any:
        """A context manager giving a reader of ``(file, offset, length)`` ranges."""
        ...


@runtime_checkable
class Prefetches(Protocol):
    """A checkpoint read over the network, which fetches a batch of tensors at once."""

    def prefetch(self, names: list[str]) -> None:
        """Fetch the bytes of the tensors ``names`` ahead of ``read_chunks``."""
        ...


@runtime_checkable
class RecordsWriter(Protocol):
    """A checkpoint whose files record the format their writer gave them (the ``format`` of a
    safetensors header's ``__metadata__``: ``pt`` from transformers, ``mlx`` from mlx-lm)."""

    @property
    def written_as(self) -> frozenset[str]:
        """The formats its files record; empty when none does."""
        ...


@runtime_checkable
class DeclaresQuantization(Protocol):
    """A checkpoint with a quantization description beside its config (NVIDIA modelopt's
    ``hf_quant_config.json``); None when the checkpoint has none."""

    @property
    def quant_config(self) -> Mapping[str, Any] | None:
        """The parsed quantization description; None when there is none."""
        ...


@runtime_checkable
class HeadersOnly(Protocol):
    """A checkpoint known by its headers, whose tensor bytes may not be at hand (a Hub
    repository): ``why_no_bytes`` is empty when they can be read."""

    @property
    def why_no_bytes(self) -> str:
        """Why tensor bytes cannot be read; empty when they can."""
        ...

    def file_sha256(self, file: str) -> str | None:
        """The sha256 of the whole file ``file`` (``TensorMeta.file``), where known for free."""
        ...


@runtime_checkable
class MainModelElsewhere(Protocol):
    """A checkpoint that may hold only part of a model by design (llama.cpp's ``--mtp`` draft:
    the nextn layer alone, its main model in the target file)."""

    @property
    def main_model_elsewhere(self) -> str:
        """Where the main model is, in words; empty when this checkpoint holds it."""
        ...


@runtime_checkable
class DraftsBeside(Protocol):
    """A checkpoint that may have its MTP layers split off into a draft file beside it
    (llama.cpp's ``--mtp`` writes ``mtp-<name>.gguf`` beside a target without them)."""

    @property
    def drafts_beside(self) -> tuple[str, ...] | None:
        """For a checkpoint declaring no MTP layer: the draft files beside it (maybe none);
        None when it declares one or is itself a draft."""
        ...
