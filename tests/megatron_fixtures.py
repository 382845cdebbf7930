"""Build real Megatron-Core checkpoints on CPU for the Megatron reader tests.

Run as a script in a subprocess (``python tests/megatron_fixtures.py single|tp2 OUT``), so
megatron-core and torch.distributed never load into the pytest process. Models are tiny
``GPTModel``s with the local (non-TE) layer spec, bf16 weights and one MTP layer; every
parameter and buffer is overwritten with seeded random values (plus ``-0.0`` and a NaN in the
MTP ``eh_proj``) so a misplaced tensor or a float conversion cannot go unnoticed.

``single`` (one gloo process) writes:

* ``dense/``: torch_dist save of a homogeneous dense model (stacked layer keys), tracker ``5``;
* ``moe/``: MoE model with ``moe_layer_freq=[0, 1]`` (per-layer keys, 4 experts, router with
  expert bias, shared experts), tracker ``3``;
* ``moe_singleton/iter_0000003``: the MoE model saved with ``singleton_local_shards`` (per-expert
  keys, SwiGLU ``linear_fc1`` split into ``weight_w`` / ``weight_v``);
* ``dense_mlm/``: the dense model saved the way Megatron-LM's ``save_checkpoint`` saves it
  (megatron-core's default torch_dist strategy, fully parallel, content metadata), tracker ``5``;
* ``bridge/iter_0000007``: the dense model saved without args (``common.pt`` is ``{}``) plus a
  Megatron-Bridge style ``run_config.yaml``;
* ``dense_ref.pt`` / ``moe_ref.pt``: ``model.state_dict()`` of each model.

``tp2`` (two gloo processes, tensor parallel 2) writes the same dense+MTP model twice:
``legacy/`` as Megatron-LM's legacy ``mp_rank_0{r}/model_optim_rng.pt`` files and ``dist_tp2/``
as a torch_dist save, both with a padded vocabulary (100 real rows of 128).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HIDDEN = 32
VOCAB_PADDED = 128
VOCAB_REAL = 100


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def single_cpu_rank() -> None:
    """One gloo rank on loopback with megatron-core's parallel state, allocating on the CPU
    (megatron-core asks ``torch.cuda.current_device()`` where to put buffers)."""
    import torch
    from megatron.core import parallel_state

    _init_distributed(0, 1, free_port())
    parallel_state.initialize_model_parallel()
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]


def _init_distributed(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)


@contextlib.contextmanager
def _cpu_current_device() -> Iterator[None]:
    """The MoE router allocates its expert-bias buffer on ``torch.cuda.current_device()``."""
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = saved  # type: ignore[assignment]


@contextlib.contextmanager
def _no_cuda_copy() -> Iterator[None]:
    """With PP > 1 the MTP stage moves its embedding copy with ``Tensor.cuda()``."""
    import torch

    saved = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = saved  # type: ignore[method-assign]


def _build_model(moe: bool, vocab: int, num_layers: int = 2, **parallel: int) -> Any:
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

    options: dict[str, Any] = {
        "num_layers": num_layers,
        "hidden_size": HIDDEN,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "ffn_hidden_size": 64,
        "normalization": "RMSNorm",
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "use_cpu_initialization": True,
        "params_dtype": torch.bfloat16,
        "bf16": True,
        "mtp_num_layers": 1,
        **parallel,
    }
    if parallel.get("pipeline_model_parallel_size", 1) > 1:
        options["pipeline_dtype"] = torch.bfloat16
    if moe:
        options.update(
            num_moe_experts=4,
            moe_layer_freq=[0, 1],
            moe_ffn_hidden_size=32,
            moe_router_topk=2,
            moe_shared_expert_intermediate_size=32,
            moe_router_score_function="sigmoid",
            moe_router_enable_expert_bias=True,
        )
    config = TransformerConfig(**options)
    if moe:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization="RMSNorm"
        )
    else:
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    with _cpu_current_device(), _no_cuda_copy():
        return GPTModel(
            config=config,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            transformer_layer_spec=spec,
            vocab_size=vocab,
            max_sequence_length=64,
            position_embedding_type="rope",
            share_embeddings_and_output_weights=False,
            mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False),
        )


def _randomise(model: Any, tp_rank: int = 0, pp_rank: int = 0, ep_rank: int = 0) -> None:
    """Seeded random values: shards of a parallel tensor differ, replicas are equal."""
    import torch

    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if b is not None)
    with torch.no_grad():
        for name, t in tensors.items():
            seed = zlib.crc32(name.encode()) + 7919 * pp_rank
            if getattr(t, "tensor_model_parallel", False):
                seed += 1000003 * tp_rank
            if ".experts." in name:
                seed += 104729 * ep_rank
            g = torch.Generator().manual_seed(seed)
            t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
            if name.endswith("eh_proj.weight"):
                t.view(-1)[0] = -0.0
                t.view(-1)[1] = float("nan")


def _args(
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    num_layers: int = 2,
    moe: bool = False,
    padded: bool = False,
) -> argparse.Namespace:
    """Megatron-LM style training args (with a megatron enum, as real runs have)."""
    import torch
    from megatron.core.transformer.enums import AttnBackend

    return argparse.Namespace(
        num_layers=num_layers,
        hidden_size=HIDDEN,
        ffn_hidden_size=64,
        num_attention_heads=4,
        num_query_groups=2,
        swiglu=True,
        num_experts=4 if moe else None,
        mtp_num_layers=1,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        vocab_size=VOCAB_REAL if padded else None,
        padded_vocab_size=VOCAB_PADDED if padded else None,
        make_vocab_size_divisible_by=32,
        params_dtype=torch.bfloat16,
        attention_backend=AttnBackend.auto,
        exit_signal=signal.SIGTERM,
        ckpt_format="torch_dist",
    )


def _save_dist(state: dict[str, Any], directory: Path) -> None:
    """Synchronous CPU torch_dist save: megatron's key translation and planner, plain DCP."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner,
        TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys,
        mcore_to_pyt_state_dict,
    )
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    class SyncCpuStrategy(TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict: Any, checkpoint_dir: Any) -> None:
            flat, _, _ = _replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica
            )
            dcp_save(
                mcore_to_pyt_state_dict(flat, False),
                storage_writer=FileSystemWriter(str(checkpoint_dir), thread_count=1),
                planner=MCoreSavePlanner(
                    dedup_replicated_tensors=not self.keep_only_main_replica,
                    flatten_state_dict=False,
                ),
            )

    directory.mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(
        state, str(directory), sharded_strategy=SyncCpuStrategy("torch_dist", 1)
    )


def _save_like_megatron_lm(state: dict[str, Any], directory: Path) -> None:
    """The save path of Megatron-LM's ``save_checkpoint`` for ``--ckpt-format torch_dist``:
    megatron-core's default strategy (two writer threads, forked writer process, a save plan in
    ``.metadata``) under ``FullyParallelSaveStrategyWrapper`` (Megatron-LM's default
    ``--ckpt-fully-parallel-save``), with ``content_metadata`` in ``common.pt``."""
    import torch
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )

    strategy = FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy("torch_dist"),
        parallel_state.get_data_parallel_group(with_context_parallel=True),
    )
    directory.mkdir(parents=True, exist_ok=True)
    saved = torch.cuda.synchronize
    torch.cuda.synchronize = lambda device=None: None  # the writer waits for CUDA copies
    try:
        with _cpu_current_device():  # finalising reduces a tensor on the current device
            dist_checkpointing.save(
                state,
                str(directory),
                strategy,
                validate_access_integrity=True,
                content_metadata={"singleton_local_shards": False},
            )
    finally:
        torch.cuda.synchronize = saved


def _sharded(model: Any, singleton: bool = False) -> Any:
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    metadata = {"dp_cp_group": group, "singleton_local_shards": singleton}
    return model.sharded_state_dict(metadata=metadata)


def _write_tracker(root: Path, text: str) -> None:
    (root / "latest_checkpointed_iteration.txt").write_text(text)


RUN_CONFIG = """\
model:
  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider
  num_layers: 2
  hidden_size: 32
  ffn_hidden_size: 64
  num_attention_heads: 4
  num_query_groups: 2
  mtp_num_layers: 1
  mtp_loss_scaling_factor: 0.1
  gated_linear_unit: true
  params_dtype:
    _target_: torch.bfloat16
    _call_: false
  activation_func: !!python/name:torch.nn.functional.silu ''
train:
  train_iters: 7
checkpoint:
  save: /somewhere/else
"""


def build_single(out: Path) -> None:
    import torch
    from megatron.core import parallel_state

    _init_distributed(0, 1, free_port())
    parallel_state.initialize_model_parallel()
    for kind, iteration in (("dense", 5), ("moe", 3)):
        torch.manual_seed(1)
        model = _build_model(moe=kind == "moe", vocab=VOCAB_PADDED)
        _randomise(model)
        root = out / kind
        state = {
            "args": _args(moe=kind == "moe"),
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "model": _sharded(model),
        }
        _save_dist(state, root / f"iter_{iteration:07d}")
        _write_tracker(root, str(iteration))
        torch.save(model.state_dict(), out / f"{kind}_ref.pt")
        if kind == "moe":
            state["model"] = _sharded(model, singleton=True)
            _save_dist(state, out / "moe_singleton" / "iter_0000003")
        if kind == "dense":
            mlm = {**state, "num_floating_point_operations_so_far": 0}
            _save_like_megatron_lm(mlm, out / "dense_mlm" / "iter_0000005")
            _write_tracker(out / "dense_mlm", "5")
            bridge = out / "bridge" / "iter_0000007"
            _save_dist({"model": _sharded(model)}, bridge)
            (bridge / "run_config.yaml").write_text(RUN_CONFIG)


PARALLEL_RUNS = {
    "tp2": ({"tensor_model_parallel_size": 2}, False, 2),
    "pp2": ({"pipeline_model_parallel_size": 2}, False, 4),
    "ep2": ({"expert_model_parallel_size": 2}, True, 2),
}
"""Two-rank runs: parallel sizes, MoE or dense, decoder layers."""


def _parallel_worker(rank: int, out: str, port: int) -> None:
    import numpy as np
    import torch
    from megatron.core import parallel_state as ps

    _init_distributed(rank, 2, port)
    for run, (sizes, moe, layers) in PARALLEL_RUNS.items():
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(**sizes)
        torch.manual_seed(1)
        model = _build_model(moe, VOCAB_PADDED, layers, **sizes)
        tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        ep = ps.get_expert_model_parallel_rank()
        _randomise(model, tp, pp, ep)
        args = _args(
            tp=sizes.get("tensor_model_parallel_size", 1),
            pp=sizes.get("pipeline_model_parallel_size", 1),
            ep=sizes.get("expert_model_parallel_size", 1),
            num_layers=layers,
            moe=moe,
            padded=True,
        )
        root = Path(out)
        state = {"args": args, "checkpoint_version": 3.0, "iteration": 4}
        _save_dist({**state, "model": _sharded(model)}, root / f"dist_{run}" / "iter_0000004")
        # Megatron-LM get_checkpoint_name: mp_rank_TT, then _PPP when PP > 1, _EEE when EP > 1.
        name = f"mp_rank_{tp:02d}"
        if args.pipeline_model_parallel_size > 1:
            name += f"_{pp:03d}"
        if args.expert_model_parallel_size > 1:
            name += f"_{ep:03d}"
        rank_dir = root / f"legacy_{run}" / "iter_0000004" / name
        rank_dir.mkdir(parents=True, exist_ok=True)
        rng_state = {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
        }
        legacy = {
            **state,
            "model": model.state_dict_for_save_checkpoint(),
            "rng_state": [rng_state],
            "num_floating_point_operations_so_far": 0,
        }
        torch.save(legacy, rank_dir / "model_optim_rng.pt")
        if rank == 0:
            _write_tracker(root / f"legacy_{run}", "4")
            _write_tracker(root / f"dist_{run}", "4")


def build_parallel(out: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_parallel_worker, args=(str(out), free_port()), nprocs=2, join=True)


if __name__ == "__main__":
    which, target = sys.argv[1], Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    {"single": build_single, "parallel": build_parallel}[which](target)
