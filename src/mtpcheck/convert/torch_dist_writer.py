"""Write canonical Megatron tensors as a real torch_dist checkpoint, without a model instance.

``build_sharded_state_dict`` turns canonical names (``GPTModel.state_dict()`` names of the local
layer spec; Transformer Engine models are refused) into the ShardedTensors and ShardedObjects
that ``GPTModel.sharded_state_dict()`` of the equivalent single-rank model (TP = PP = EP = 1)
produces: stacked or per-layer decoder keys, the expert axis, torch_dist key renames, SwiGLU
``[gate; up]`` fragments, ``_extra_state`` objects of linear layers, replica ids. The keys
follow :mod:`mtpcheck.formats.torch_dist_keys` (the scheme the torch_dist reader reads by),
for the layout :func:`mtpcheck.convert.megatron_config.torch_dist_layout` gives the config.
``write_torch_dist`` saves them with megatron-core's ``dist_checkpointing`` in the Megatron-LM
directory layout::

    dst_root/latest_checkpointed_iteration.txt      "<iteration>" or "release"
    dst_root/iter_0000001/ (or release/)            metadata.json .metadata __0_0.distcp common.pt

With ``thread_count`` N > 1 torch's storage writer splits the tensors by size into N files,
``__0_0.distcp`` to ``__0_{N-1}.distcp``, each written by its own thread (megatron-core's own
default for a torch_dist save is 2); ``.metadata`` says which file holds each chunk, so a load
is the same whichever N wrote it.

Tensors are wrapped as views, so peak memory is the tensors passed in plus the one chunk the
storage writer copies at a time per thread (a SwiGLU half, whose view does not own its
storage); with ``materialise`` the tensors passed in are placeholders and the real ones exist
one at a time per writer thread.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from mtpcheck.convert.file_ranges import buffer_address
from mtpcheck.convert.megatron_config import torch_dist_layout
from mtpcheck.convert.megatron_import import enter_megatron_core
from mtpcheck.formats.torch_dist_keys import Placement, to_sharded_key
from mtpcheck.torch_threads import configure_torch_threads

enter_megatron_core()  # the writer's modules only, not all of megatron-core (2 s less)

from megatron.core import dist_checkpointing, parallel_state  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.strategies.torch import (  # noqa: E402
    MCoreSavePlanner,
    TorchDistSaveShardedStrategy,
    _replace_state_dict_keys_with_sharded_keys,
    mcore_to_pyt_state_dict,
)

CHECKPOINT_VERSION = 3.0
TRACKER_FILE = "latest_checkpointed_iteration.txt"
CONTENT_METADATA: Mapping[str, Any] = {
    "distrib_optim_sharding_type": "dp_reshardable",
    "singleton_local_shards": False,
    "chained_optim_avoid_prefix": True,
}
"""What Megatron-LM 0.16 stores as ``content_metadata`` and passes to ``sharded_state_dict``."""

_REPLICA = (0, 0, 0)
_LINEAR_MODULE = re.compile(r"(?:^|\.)(?:linear_[a-z0-9_]+|eh_proj|in_proj|out_proj)$")
_SHAPE_TOLERANT = ("embedding.word_embeddings.", "output_layer.")


def _sharded_tensors(name: str, tensor: torch.Tensor, p: Placement) -> list[ShardedTensor]:
    tolerant = name.startswith(_SHAPE_TOLERANT)
    n = len(p.offsets)
    if p.row_parts:
        rows = [r for _, r in p.row_parts]
        if tensor.shape[0] != sum(rows):
            raise ValueError(f"{name}: {tensor.shape[0]} rows, the layout needs {sum(rows)}")
        return [
            ShardedTensor.from_rank_offsets(
                f"{p.key}.{part}", piece, *p.offsets, replica_id=_REPLICA, prepend_axis_num=n
            )
            for (part, _), piece in zip(p.row_parts, torch.split(tensor, rows), strict=True)
        ]
    if not p.glu_fc1:
        return [
            ShardedTensor.from_rank_offsets(
                p.key,
                tensor,
                *p.offsets,
                replica_id=_REPLICA,
                prepend_axis_num=n,
                allow_shape_mismatch=tolerant,
            )
        ]
    if tensor.shape[0] % 2:
        raise ValueError(f"{name}: SwiGLU fc1 needs an even number of rows, got {tensor.shape}")
    gate, up = torch.chunk(tensor, 2, dim=0)
    return [
        ShardedTensor.from_rank_offsets(
            p.key, half, *p.offsets, (n, index, 2), replica_id=_REPLICA, prepend_axis_num=n
        )
        for index, half in enumerate((gate, up))
    ]


def _extra_state(name: str, p: Placement) -> ShardedObject | None:
    """The ``_extra_state`` object of the linear module owning this tensor, if it has one.

    Megatron's local linear layers carry an (empty) extra state; norms, the router and the
    embedding do not, and the GPT model drops the output layer's.
    """
    module = name.rpartition(".")[0]
    if not _LINEAR_MODULE.search(module) or module == "output_layer":
        return None
    if p.offsets:
        ordered = sorted(p.offsets)
        shape = tuple(frag for _, _, frag in ordered)
        offset = tuple(off for _, off, _ in ordered)
    else:
        shape, offset = (1,), (0,)
    key = f"{p.key.rpartition('.')[0]}._extra_state"
    return ShardedObject(key, None, shape, offset, replica_id=_REPLICA)


def build_sharded_state_dict(
    tensors: Mapping[str, torch.Tensor], transformer_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The model part of a torch_dist state dict for canonical tensors (no model instance).

    Keys are canonical names (``…/_extra_state`` entries are named like the state_dict's);
    values are ShardedTensors, a ``[gate, up]`` pair for SwiGLU ``linear_fc1`` tensors, or
    ShardedObjects. The tensors are referenced, never copied.
    """
    layout = torch_dist_layout(transformer_kwargs)
    out: dict[str, Any] = {}
    for name, tensor in tensors.items():
        if name.endswith("_extra_state"):
            raise ValueError(f"{name}: pass tensors only; _extra_state entries are generated")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        placement = to_sharded_key(name, layout)
        shards = _sharded_tensors(name, tensor, placement)
        out[name] = shards if len(shards) > 1 else shards[0]
        extra = _extra_state(name, placement)
        if extra is not None:
            out.setdefault(f"{name.rpartition('.')[0]}._extra_state", extra)
    return out


Materialise = Callable[[torch.Tensor], torch.Tensor]
"""Maps a tensor of the state dict (or a view of it) to the tensor whose bytes are written."""
FileBytes = Callable[[int, int], "tuple[int, int] | None"]
"""``(address, length)`` of bytes in memory -> ``(descriptor, offset)`` of a file holding the
same bytes (memory that is an untouched private map of that file), or None."""
KERNEL_COPY_MIN = 1 << 20
"""Writes smaller than this are never looked up (headers, pickles): not worth a system call."""


class _KernelCopyStream:
    """A ``.distcp`` file being written, which copies inside the kernel what it can.

    ``torch.save`` hands each tensor record's bytes to ``write`` in one call, straight from the
    tensor's memory. Where ``file_bytes`` says that memory is an untouched map of a source file,
    the bytes are copied file to file with ``copy_file_range`` (as ``cp`` does: no page faults
    on the map, no trip through user space); anything else, or a refused copy, is written from
    memory as it would have been. Either way the file gets the same bytes at the same place.
    """

    def __init__(self, stream: io.IOBase, file_bytes: FileBytes) -> None:
        self._stream = stream
        self._file_bytes = file_bytes

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes >= KERNEL_COPY_MIN:
            where = self._file_bytes(buffer_address(view), view.nbytes)
            if where is not None:
                return self._copy(view, *where)
        written: int = self._stream.write(view)  # io.IOBase declares write untyped
        return written

    def _copy(self, view: memoryview, fd: int, offset: int) -> int:
        self._stream.flush()
        start = self._stream.tell()
        done = 0
        with contextlib.suppress(OSError):  # refused (another file system, ...): write the rest
            while done < view.nbytes:
                n = os.copy_file_range(
                    fd, self._stream.fileno(), view.nbytes - done, offset + done, start + done
                )
                if n == 0:
                    break
                done += n
        self._stream.seek(start + done)
        if done < view.nbytes:
            self._stream.write(view[done:])
        return view.nbytes

    def tell(self) -> int:
        return self._stream.tell()

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        self._stream.close()


class _KernelCopyFileSystem(FileSystem):
    """torch DCP's local file system, its written files :class:`_KernelCopyStream` s."""

    def __init__(self, file_bytes: FileBytes) -> None:
        super().__init__()
        self._file_bytes = file_bytes

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" in mode:
                yield _KernelCopyStream(stream, self._file_bytes)
            else:
                yield stream


class _MaterialisingPlanner(MCoreSavePlanner):  # type: ignore[misc]  # megatron-core is untyped
    """Hands the storage writer ``materialise(tensor)`` instead of the state dict's tensor.

    Each thread of the storage writer resolves one item at a time, after it has written its
    previous one, so ``materialise`` may reclaim the memory of what it returned to that thread
    before. With several threads, calls come from each of them concurrently.
    """

    def __init__(self, materialise: Materialise | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._materialise = materialise

    def resolve_data(self, write_item: Any) -> Any:
        data = super().resolve_data(write_item)
        if self._materialise is not None and isinstance(data, torch.Tensor):
            return self._materialise(data)
        return data


class SyncTorchDistSaveStrategy(TorchDistSaveShardedStrategy):  # type: ignore[misc]  # untyped
    """The torch_dist (version 1) save strategy, run synchronously on CPU.

    The inherited ``save`` goes through the async writer, whose preload and finalize steps call
    CUDA. This ``save`` hands megatron's translated state dict and planner to a plain
    synchronous ``torch.distributed.checkpoint.save``; the files are those of a GPU save.
    """

    def __init__(
        self,
        thread_count: int = 1,
        materialise: Materialise | None = None,
        durable: bool = True,
        file_bytes: FileBytes | None = None,
    ) -> None:
        super().__init__("torch_dist", 1, thread_count=thread_count)
        self.materialise = materialise
        self.durable = durable
        self.file_bytes = file_bytes

    def save(self, sharded_state_dict: dict[str, Any], checkpoint_dir: str | Path) -> None:
        """Write ``sharded_state_dict`` to ``checkpoint_dir`` as megatron-core would,
        synchronously, on CPU."""
        by_key, _, _ = _replace_state_dict_keys_with_sharded_keys(
            sharded_state_dict, self.keep_only_main_replica
        )
        planner = _MaterialisingPlanner(
            self.materialise,
            dedup_replicated_tensors=not self.keep_only_main_replica,
            flatten_state_dict=False,
        )
        # per_thread_copy_ahead=0: the serial loader, which resolves (materialises) an item
        # only after the previous one is written, even where CUDA is available; with
        # thread_count > 1 each thread writes its own .distcp file
        writer = FileSystemWriter(
            str(checkpoint_dir),
            thread_count=self.thread_count,
            per_thread_copy_ahead=0,
            sync_files=self.durable,
        )
        if self.file_bytes is not None:
            writer.fs = _KernelCopyFileSystem(self.file_bytes)
        with _record_checksums(self.durable):
            dcp_save(mcore_to_pyt_state_dict(by_key, False), storage_writer=writer, planner=planner)


@contextlib.contextmanager
def _record_checksums(on: bool) -> Iterator[None]:
    """Whether ``torch.save`` computes the CRC-32 of each record it writes (the zip format's
    checksum, which neither torch nor megatron-core checks on load): it runs at a few hundred
    MB/s here, the slowest part of writing. Skipped only for checkpoints that are read back
    and deleted (``durable=False``); restored afterwards."""
    serialization = torch.serialization
    if on or not hasattr(serialization, "set_crc32_options"):
        yield
        return
    previous = serialization.get_crc32_options()
    serialization.set_crc32_options(False)
    try:
        yield
    finally:
        serialization.set_crc32_options(previous)


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A one-rank gloo process group and TP=PP=1 model-parallel state for the duration.

    Reuses what is already initialised (it must be single-rank) and tears down only what it
    created.
    """
    created_group = False
    if not dist.is_initialized():
        # HashStore: exported by torch.distributed at run time (not on Windows), not in its stubs
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        created_group = True
    elif dist.get_world_size() != 1:
        raise RuntimeError("write_torch_dist runs in a single process (world size 1)")
    created_parallel = False
    try:
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
            created_parallel = True
        yield
    finally:
        if created_parallel:
            parallel_state.destroy_model_parallel()
        if created_group:
            dist.destroy_process_group()


def iteration_dir_name(iteration: int | str) -> str:
    """``iter_{:07d}`` or ``release``, as Megatron-LM names checkpoint directories."""
    if iteration == "release":
        return "release"
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError(f"iteration must be a non-negative int or 'release', not {iteration!r}")
    return f"iter_{iteration:07d}"


def _namespace(args: argparse.Namespace | Mapping[str, Any]) -> argparse.Namespace:
    values = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)
    return argparse.Namespace(**values)


def _check_args(
    ns: argparse.Namespace,
    transformer_kwargs: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
) -> None:
    for key in ("num_layers", "hidden_size", "mtp_num_layers"):
        if not hasattr(ns, key):
            raise ValueError(f"args lacks {key!r}")
        if getattr(ns, key) != transformer_kwargs.get(key):
            raise ValueError(
                f"args.{key}={getattr(ns, key)!r} but the transformer config has "
                f"{transformer_kwargs.get(key)!r}"
            )
    embedding = tensors.get("embedding.word_embeddings.weight")
    padded = getattr(ns, "padded_vocab_size", None)
    if embedding is not None and padded is not None and embedding.shape[0] != padded:
        raise ValueError(
            f"args.padded_vocab_size={padded} but the embedding has {embedding.shape[0]} rows"
        )


def write_torch_dist(
    dst_root: str | Path,
    tensors: Mapping[str, torch.Tensor],
    transformer_kwargs: Mapping[str, Any],
    args: argparse.Namespace | Mapping[str, Any],
    iteration: int | str,
    materialise: Materialise | None = None,
    durable: bool = True,
    thread_count: int = 1,
    file_bytes: FileBytes | None = None,
) -> Path:
    """Write ``tensors`` (canonical names) as a Megatron-LM torch_dist checkpoint.

    With ``materialise``, ``tensors`` only need the right shape and dtype (they plan the save):
    each one (or each view of one) is passed to ``materialise`` right before it is written, and
    what it returns is written instead (same shape and dtype). Calls come one at a time from
    each of the ``thread_count`` writer threads (one ``.distcp`` file each), each after that
    thread's previous result is written, so the real tensors can be produced one at a time per
    thread.

    ``common.pt`` holds ``args`` (an ``argparse.Namespace``), ``checkpoint_version`` 3.0,
    ``iteration`` (0 for ``"release"``) and ``content_metadata``. Runs on CPU in this process;
    a process group is created (and destroyed) when none exists. Returns the iteration
    directory. Refuses to write into a non-empty iteration directory. ``durable=False`` skips
    the ``fsync`` of each data file and the CRC-32 of each record (for a checkpoint that is
    read back and deleted). With ``file_bytes``, tensor bytes that lie in a file as they are
    (memory it says maps a file) are copied from that file inside the kernel
    (:class:`_KernelCopyStream`): the same bytes, written without passing through memory.
    """
    configure_torch_threads()  # torch copies the tensors it saves: see mtpcheck.torch_threads
    root = Path(dst_root)
    ckpt_dir = root / iteration_dir_name(iteration)
    if ckpt_dir.exists() and any(ckpt_dir.iterdir()):
        raise FileExistsError(f"{ckpt_dir} is not empty")
    ns = _namespace(args)
    _check_args(ns, transformer_kwargs, tensors)
    model = build_sharded_state_dict(tensors, transformer_kwargs)
    state = {
        "args": ns,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": 0 if iteration == "release" else iteration,
        "model": model,
    }
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    with single_process_group():
        dist_checkpointing.save(
            state,
            str(ckpt_dir),
            sharded_strategy=SyncTorchDistSaveStrategy(
                thread_count=thread_count,
                materialise=materialise,
                durable=durable,
                file_bytes=file_bytes,
            ),
            content_metadata=dict(CONTENT_METADATA),
        )
    (root / TRACKER_FILE).write_text(str(iteration))
    return ckpt_dir
