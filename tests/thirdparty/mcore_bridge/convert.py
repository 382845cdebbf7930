#!/usr/bin/env python3
"""HF -> Megatron (torch_dist) -> HF round trip with the real mcore-bridge 1.6.5 (ModelScope),
on CPU.

    /work/venvs/mcb/bin/python convert.py FIXTURE_DIR OUT_DIR [--mtp-num-layers N]

Writes
  OUT_DIR/megatron/    the torch_dist checkpoint (iter_0000001/, latest_checkpointed_iteration.txt,
                       args.json), written the way ms-swift 4.6's `megatron export --to_mcore true`
                       writes it (swift/megatron/utils/megatron_lm_utils.py save_mcore_checkpoint)
  OUT_DIR/hf/          what GPTBridge.save_weights writes back from that checkpoint, plus the HF
                       config.json as ms-swift's patched save_weights writes it
  OUT_DIR/convert.json versions, the steps that ran, seconds, and any exception in one line
  OUT_DIR/convert.log  the libraries' output

The conversion is mcore-bridge's public API, called the way ms-swift 4.6 calls it
(swift/megatron/model/utils.py get_mcore_model_config, pipelines/export/export.py):
  import: AutoConfig.from_pretrained(FIXTURE) -> hf_to_mcore_config(hf_config)
          -> ModelConfig (or the model meta's config_cls, e.g. MLAModelConfig)(**kwargs,
             mcore_model_type=..., hf_config=..., params_dtype=<config dtype>[, mtp_num_layers=N])
          -> get_mcore_model(config) -> config.bridge.load_weights(models, FIXTURE)
          -> megatron.core.dist_checkpointing.save({'model': model.sharded_state_dict(...), ...},
             OUT_DIR/megatron/iter_0000001, TorchDistSaveShardedStrategy)   [ms-swift's save path]
  export: the same ModelConfig (mtp_num_layers from OUT_DIR/megatron/args.json, as ms-swift reads
          args.json of --mcore_model) -> get_mcore_model -> dist_checkpointing.load(...) ->
          model.load_state_dict(state_dict['model'], strict=False)            [ms-swift's load path]
          -> config.bridge.save_weights(models, OUT_DIR/hf) -> hf_config.save_pretrained(OUT_DIR/hf)
             (with num_nextn_predict_layers / mtp_num_hidden_layers set to mtp_num_layers when
             that is set, as ms-swift's _patch_mcore_bridge does)

--mtp-num-layers N is ms-swift's `--mtp_num_layers N`: ModelConfig(mtp_num_layers=N).  Without it
mtp_num_layers stays None (mcore-bridge's hf_to_mcore_config never reads an MTP count from the HF
config), so no MTP block is built -- the behaviour of ms-swift issue 9504.

Shims: the functions named shim_* (import-stubs, torch-cuda, cpu-rng-tracker, cpu-te-backend) and
cpu_config_overrides().  The TE stand-ins and the torch.cuda / RNG shims are copied unchanged from
tests/thirdparty/megatron_bridge_062/convert.py (same megatron-core 0.19.2).  Each replaces a
CUDA-only or Transformer-Engine-only call, module or kernel with plain torch, or turns a CUDA-only
*setting* off.  None of them reads, writes or reorders a weight; nothing inside the installed
packages is edited (monkeypatches in this process only).  convert.json lists the shims applied and
every config field changed.

Tested with: Python 3.12.1, torch 2.13.0 (PyPI CUDA 13 build, run on CPU), megatron-core 0.19.2,
mcore-bridge 1.6.5 (--no-deps), transformers 5.18.0, peft 0.20.0, accelerate 1.15.0, modelscope
1.40.2 (see install_venv.sh).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import types

SHIMS_APPLIED: list[str] = []


# ----------------------------------------------------------------------------------------------
# Import-time stubs (scoped).  Applied before anything of Megatron is imported.
# (machinery copied from tests/thirdparty/megatron_bridge_062/convert.py)
# ----------------------------------------------------------------------------------------------
_real_import = builtins.__import__


class _Stubbed:
    def __init__(self, *a, **k):
        raise RuntimeError("stubbed out by convert.py (CPU-only harness)")


def _stub_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        val = (
            _stub_module(f"{name}.{attr}")
            if attr in ("pytorch", "ops", "language", "writer", "common")
            else type(attr, (_Stubbed,), {})
        )
        setattr(mod, attr, val)
        return val

    mod.__getattr__ = __getattr__
    return mod


# stubbed module name -> (stub, importer __name__ prefixes it is served to)
_STUBS: dict[str, tuple[types.ModuleType, tuple[str, ...]]] = {}


def _scoped_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        for key, (stub, prefixes) in _STUBS.items():
            if name == key or name.startswith(key + "."):
                importer = (globals or {}).get("__name__", "")
                if not importer.startswith(prefixes):
                    break
                if "." in key and not fromlist:  # `import a.b.c` binds `a`: leave it alone
                    break
                mod = stub
                if fromlist:
                    for part in name[len(key) :].split(".")[1:]:
                        mod = getattr(mod, part)
                return mod
    return _real_import(name, globals, locals, fromlist, level)


@contextlib.contextmanager
def _null_context(*a, **k):
    yield


def _te_stub() -> types.ModuleType:
    """``transformer_engine`` as mcore-bridge uses it at build time: only
    ``transformer_engine.pytorch.fp8_model_init(enabled=False)`` / ``fp8_autocast(enabled=False)``
    (context managers, entered around module construction: mtp_layer.py, gated_delta_net.py,
    dsa_indexer.py, compressor.py) and patcher._patch_transformer_engine's attribute probes.
    Everything else on it is a placeholder class that raises when called."""
    te = _stub_module("transformer_engine")
    te.pytorch.fp8_model_init = _null_context
    te.pytorch.fp8_autocast = _null_context
    return te


def _datasets_stub() -> types.ModuleType:
    """``datasets.utils.filelock.FileLock`` (mcore_bridge.utils.torch_utils) is a re-export of
    ``filelock.FileLock``; serve that instead of installing datasets (+pyarrow, pandas)."""
    import filelock

    ds = types.ModuleType("datasets")
    ds.utils = types.ModuleType("datasets.utils")
    ds.utils.filelock = types.ModuleType("datasets.utils.filelock")
    ds.utils.filelock.FileLock = filelock.FileLock
    return ds


def shim_import_stubs() -> None:
    """SHIM import-stubs: serve placeholder modules to the few importers that need them.

    Only the named importing modules see the stub; for every other module the package stays
    absent, so megatron-core keeps HAVE_TE=False and picks its non-TE paths.

    * ``transformer_engine`` (+ ``transformer_engine.pytorch``) <- ``mcore_bridge.*``: mcore-bridge
      imports it unconditionally (patcher.py, model/modules/mtp_layer.py, gated_delta_net.py,
      dsa_indexer.py, compressor.py, gpts/deepseek_v4.py:
      ``import transformer_engine.pytorch as te``).
      See _te_stub for what is callable.
    * ``datasets`` <- ``mcore_bridge.utils.torch_utils``: see _datasets_stub.
    * ``selective_scan_cuda`` <- ``mamba_ssm.ops.selective_scan_interface``: the CUDA extension of
      mamba-ssm (installed with MAMBA_SKIP_CUDA_BUILD=TRUE, so it is not built); as in the
      Megatron-Bridge harness.  Without it megatron-core's MambaMixer (Nemotron-H) raises
      "ImportError: MambaSSM is not installed."
    """
    te = _te_stub()
    _STUBS["transformer_engine"] = (te, ("mcore_bridge",))
    _STUBS["transformer_engine_torch"] = (
        _stub_module("transformer_engine_torch"),
        ("mcore_bridge",),
    )
    _STUBS["datasets"] = (_datasets_stub(), ("mcore_bridge.utils.torch_utils",))
    _STUBS["selective_scan_cuda"] = (
        _stub_module("selective_scan_cuda"),
        ("mamba_ssm.ops.selective_scan_interface",),
    )
    builtins.__import__ = _scoped_import
    SHIMS_APPLIED.append("import-stubs")


def _setup_env(tmp: str) -> None:
    """Caches and temp files under a private /tmp dir; offline; gloo on loopback."""
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf_home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tmp, "triton"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    os.environ.setdefault("TMPDIR", tmp)
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


# ----------------------------------------------------------------------------------------------
# Runtime shims
# ----------------------------------------------------------------------------------------------
def shim_torch_cuda() -> None:
    """SHIM torch-cuda: the three torch.cuda calls reached while building/saving on CPU.

    * ``torch.cuda.current_device`` -> the CPU device: the MoE router (``expert_bias``,
      ``local_tokens_per_expert``) and other modules allocate buffers on
      ``device=torch.cuda.current_device()``.
    * ``torch.cuda.synchronize`` -> no-op: mcore's torch_dist writer calls it before copying
      tensors; nothing runs asynchronously on CPU.
    * ``torch.cuda.get_rng_state`` -> empty state: collected by the save path, not written
      (the bridge saves with ``save_rng=False``).
    """
    import torch

    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)
    SHIMS_APPLIED.append("torch-cuda")


def shim_cuda_device_to_cpu() -> None:
    """SHIM cuda-device-to-cpu: ``device='cuda'`` -> the CPU in tensor factories and ``Tensor.to``.

    mcore-bridge's GPTBridge hard-codes ``device='cuda'`` for the one-element flags it all-reduces
    over the pipeline group while converting (``torch.tensor([is_lora, is_modules_to_save],
    dtype=torch.bool, device='cuda')`` in ``_set_state_dict``, ``is_lora``/``is_moe``/
    ``has_model`` flags, ``_reduce_tensor_pp_group``) and moves exported tensors with
    ``tensor.to('cuda')`` (``_all_gather_tp``) before gathering over tensor parallel ranks.  On a
    machine without CUDA each of these calls raises; here they produce the same tensor on the CPU
    (world size 1: every collective is the identity).  Only calls that name a CUDA device are
    changed; all others go through unchanged.
    """
    import functools

    import torch

    def is_cuda(d):
        return (isinstance(d, str) and d.startswith("cuda")) or (
            isinstance(d, torch.device) and d.type == "cuda"
        )

    def fix_factory(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            if is_cuda(k.get("device")):
                k["device"] = "cpu"
            return fn(*a, **k)

        return wrapper

    for name in ("tensor", "empty", "zeros", "ones", "full", "arange", "as_tensor"):
        setattr(torch, name, fix_factory(getattr(torch, name)))

    orig_to = torch.Tensor.to

    @functools.wraps(orig_to)
    def to(self, *a, **k):
        if a and is_cuda(a[0]):
            a = ("cpu", *a[1:])
        if is_cuda(k.get("device")):
            k["device"] = "cpu"
        return orig_to(self, *a, **k)

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    SHIMS_APPLIED.append("cuda-device-to-cpu")


def shim_cpu_rng_tracker() -> None:
    """SHIM cpu-rng-tracker: ``CudaRNGStatesTracker.fork()`` forks the CPU generator instead.

    Weight *initialisation* outside ``use_cpu_initialization`` (EXAONE-4.5's vision/LM
    attention is built that way) runs under ``get_cuda_rng_tracker().fork()``, which needs a
    CUDA generator state registered by ``model_parallel_cuda_manual_seed`` (skipped without a
    GPU by the bridge's ``temporary_distributed_context``).  On CPU the fork saves and restores
    the CPU generator around the block.  It only changes which generator draws the random
    initial values, which the bridge then overwrites with the HF weights.
    """
    import contextlib

    import torch
    from megatron.core.tensor_parallel import random as mrandom

    @contextlib.contextmanager
    def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
        with torch.random.fork_rng(devices=[]):
            yield

    mrandom.CudaRNGStatesTracker.fork = fork
    SHIMS_APPLIED.append("cpu-rng-tracker")


_TE_STAND_INS: dict = {}


def sweep_te_names() -> list[str]:
    """Part of SHIM cpu-te-backend: in every loaded ``megatron.*`` module, a TE class name bound
    to None (the ``else`` branch of ``if HAVE_TE:``) gets its CPU stand-in.  Returns
    "module.name" for each binding it set."""
    done = []
    for mname, mod in list(sys.modules.items()):
        if not mname.startswith("megatron.") or mod is None:
            continue
        d = getattr(mod, "__dict__", {})
        for name, cls in _TE_STAND_INS.items():
            if name in d and d[name] is None:
                setattr(mod, name, cls)
                done.append(f"{mname}.{name}")
    return done


def shim_cpu_te_backend() -> None:
    """SHIM cpu-te-backend: a CPU stand-in for Transformer Engine's spec provider.

    (Docstring from the Megatron-Bridge harness; for mcore-bridge the same holds: its
    ModelLoader calls ``get_gpt_decoder_block_spec(..., use_transformer_engine=True)`` and
    ``get_gpt_mtp_block_spec(..., use_transformer_engine=True)`` unconditionally, and its GPTBridge
    names TE's parameters.)  Megatron-Bridge 0.6.2 always builds the Transformer-Engine layer spec
    (``gpt_provider.default_layer_spec`` -> ``get_gpt_layer_with_transformer_engine_spec``;
    ``mtp_block_spec`` -> ``get_gpt_mtp_block_spec(..., use_transformer_engine=True)``; Qwen3.5 /
    Qwen3-Next / GLM-5 -> megatron-core's experimental attention builder, which asserts
    ``transformer_impl == "transformer_engine"`` and instantiates ``TESpecProvider``), and its
    weight mappings name TE's parameters (``linear_qkv.layer_norm_weight``,
    ``mlp.linear_fc1.layer_norm_weight``, ``experts.linear_fc1.weight{i}``).  Without TE none
    of that builds.

    So every place megatron-core looks up ``TESpecProvider`` (and the few TE classes it names
    directly: ``TENorm`` in gpt_layer_specs, ``TELinear``/``TEColumnParallelLinear``/
    ``TELayerNormColumnParallelLinear`` in the MLA modules, ``TELinear`` in moe_layer) gets a
    provider whose modules are plain torch and have TE's class names, parameter names, shapes
    and ``sharded_state_dict`` layout:

    ========================================  ===============================================
    TE module                                 CPU stand-in (this file)
    ========================================  ===============================================
    TENorm (te LayerNorm/RMSNorm)             ``TENorm``: ``weight`` (+ ``bias``); honours
                                              ``layernorm_zero_centered_gamma`` like TE
    TELayerNormColumnParallelLinear           ``TELayerNormColumnParallelLinear``: mcore's
                                              ColumnParallelLinear + ``layer_norm_weight``
                                              (+ ``layer_norm_bias``), norm applied first
    TEColumnParallelLinear / TERowParallel..  subclasses of mcore's ColumnParallelLinear /
                                              RowParallelLinear under the TE names, taking TE's
                                              keyword arguments (same ``weight``/``bias``, axes)
    TELinear (parallel_mode duplicated/None)  ``TELinear``: ``weight`` (+ ``bias``), replicated
    TEDotProductAttention                     ``TEDotProductAttention``: mcore's local
                                              DotProductAttention (no parameters), TE-only
                                              kwargs (k_channels, v_channels, ...) dropped
    TEColumn/RowParallelGroupedLinear         ``TEColumnParallelGroupedLinear`` /
                                              ``TERowParallelGroupedLinear``: ``weight{i}``
                                              (+ ``bias{i}``) per local expert, a python loop of
                                              F.linear; sharded_state_dict as TE's
                                              ``_sharded_state_dict_grouped``
    TEActivationOp                            None (the config's activation function)
    ========================================  ===============================================

    The class names matter: the bridge picks TP handling from ``type(module).__name__``
    (``AutoMapping._detect_parallelism_type``).  Differences from a real TE build, none of which
    touches a weight: TENorm, TELinear and the grouped linears write no ``_extra_state``
    entry (TE stores FP8 metadata there; the Column/RowParallel-based stand-ins write mcore's
    empty one); TE's fused kernels are eager torch in ``forward`` (never run by conversion).
    """
    from functools import partial

    # The TE extension module must be patched before anything imports names from it.
    import megatron.core.extensions.transformer_engine as te_ext
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.models.backends import BackendSpecProvider
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
    from megatron.core.utils import get_pg_rank, get_pg_size
    from torch.nn.parameter import Parameter

    def _norm(x, weight, bias, normalization, eps, zero_centered):
        w = weight + 1 if zero_centered else weight
        if normalization == "RMSNorm":
            return F.rms_norm(x, (x.shape[-1],), w, eps)
        return F.layer_norm(x, (x.shape[-1],), w, bias, eps)

    def _norm_params(module, config, size, prefix):
        init = torch.zeros if config.layernorm_zero_centered_gamma else torch.ones
        module.register_parameter(
            f"{prefix}weight", Parameter(init(size, dtype=config.params_dtype))
        )
        if config.normalization == "LayerNorm":
            module.register_parameter(
                f"{prefix}bias", Parameter(torch.zeros(size, dtype=config.params_dtype))
            )
        else:
            module.register_parameter(f"{prefix}bias", None)

    class TENorm(torch.nn.Module):
        """CPU stand-in for TENorm (te.pytorch.LayerNorm / RMSNorm)."""

        def __init__(self, config, hidden_size, eps=1e-5, has_residual=False, **_):
            super().__init__()
            self.config, self.eps = config, eps
            _norm_params(self, config, hidden_size, "")

        def forward(self, x):
            c = self.config
            return _norm(
                x,
                self.weight,
                self.bias,
                c.normalization,
                self.eps,
                c.layernorm_zero_centered_gamma,
            )

    class TELayerNormColumnParallelLinear(ColumnParallelLinear):
        """CPU stand-in for TE LayerNormLinear: layer_norm_weight(/bias) + column-parallel."""

        def __init__(
            self,
            input_size,
            output_size,
            *,
            config,
            init_method,
            gather_output,
            bias,
            skip_bias_add,
            is_expert,
            skip_weight_param_allocation=False,
            tp_comm_buffer_name=None,
            tp_group=None,
            stride=1,
            name=None,
        ):
            super().__init__(
                input_size,
                output_size,
                config=config,
                init_method=init_method,
                bias=bias,
                gather_output=gather_output,
                stride=stride,
                skip_bias_add=skip_bias_add,
                skip_weight_param_allocation=skip_weight_param_allocation,
                is_expert=is_expert,
                tp_comm_buffer_name=tp_comm_buffer_name,
                tp_group=tp_group,
                name=name,
            )
            _norm_params(self, config, input_size, "layer_norm_")
            self.eps = config.layernorm_epsilon

        def forward(self, x, *a, **k):
            c = self.config
            x = _norm(
                x,
                self.layer_norm_weight,
                self.layer_norm_bias,
                c.normalization,
                self.eps,
                c.layernorm_zero_centered_gamma,
            )
            return super().forward(x, *a, **k)

    class TEColumnParallelLinear(ColumnParallelLinear):
        """CPU stand-in for TEColumnParallelLinear: mcore's ColumnParallelLinear."""

        def __init__(
            self,
            input_size,
            output_size,
            *,
            config,
            init_method,
            gather_output,
            bias,
            skip_bias_add,
            is_expert,
            skip_weight_param_allocation=False,
            tp_comm_buffer_name=None,
            tp_group=None,
            stride=1,
            name=None,
            **_,
        ):
            super().__init__(
                input_size,
                output_size,
                config=config,
                init_method=init_method,
                bias=bias,
                gather_output=gather_output,
                stride=stride,
                skip_bias_add=skip_bias_add,
                skip_weight_param_allocation=skip_weight_param_allocation,
                is_expert=is_expert,
                tp_comm_buffer_name=tp_comm_buffer_name,
                tp_group=tp_group,
                name=name,
            )

    class TERowParallelLinear(RowParallelLinear):
        """CPU stand-in for TERowParallelLinear: mcore's RowParallelLinear (same names/axes)."""

        def __init__(
            self,
            input_size,
            output_size,
            *,
            config,
            init_method,
            bias,
            input_is_parallel,
            skip_bias_add,
            is_expert,
            tp_comm_buffer_name=None,
            tp_group=None,
            name=None,
            **_,
        ):
            super().__init__(
                input_size,
                output_size,
                config=config,
                init_method=init_method,
                bias=bias,
                input_is_parallel=input_is_parallel,
                skip_bias_add=skip_bias_add,
                is_expert=is_expert,
                tp_comm_buffer_name=tp_comm_buffer_name,
                tp_group=tp_group,
                name=name,
            )

    class TELinear(MegatronModule):
        """CPU stand-in for TELinear with parallel_mode duplicated/None (replicated weight)."""

        def __init__(
            self,
            input_size,
            output_size,
            *,
            parallel_mode,
            config,
            init_method,
            bias,
            skip_bias_add,
            skip_weight_param_allocation=False,
            tp_comm_buffer_name=None,
            is_expert=False,
            symmetric_ar_type=None,
            tp_group=None,
            name=None,
            gtp_remat_group=None,
        ):
            super().__init__(config=config)
            if parallel_mode == "duplicated":
                parallel_mode = None
            if parallel_mode is not None:
                raise NotImplementedError(f"CPU TELinear: parallel_mode={parallel_mode!r}")
            self.parallel_mode = None
            self.te_return_bias = skip_bias_add and bias
            self._tp_group = parallel_state.get_tensor_model_parallel_group()
            self.weight = Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            if config.perform_initialization:
                init_method(self.weight)
            if bias:
                self.bias = Parameter(torch.zeros(output_size, dtype=config.params_dtype))
            else:
                self.register_parameter("bias", None)

        def forward(self, x):
            if self.te_return_bias:
                return F.linear(x, self.weight), self.bias
            return F.linear(x, self.weight, self.bias), None

        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            state_dict = self.state_dict(prefix="", keep_vars=True)
            return make_sharded_tensors_for_checkpoint(
                state_dict,
                prefix,
                None,
                sharded_offsets,
                tp_group=self._tp_group,
                dp_cp_group=(metadata or {}).get("dp_cp_group"),
            )

    class TEDotProductAttention(DotProductAttention):
        """CPU stand-in for TEDotProductAttention: mcore's local DotProductAttention."""

        def __init__(
            self,
            config,
            layer_number,
            attn_mask_type,
            attention_type,
            attention_dropout=None,
            softmax_scale=None,
            k_channels=None,
            v_channels=None,
            cp_comm_type="p2p",
            pg_collection=None,
            **_,
        ):
            super().__init__(
                config,
                layer_number,
                attn_mask_type,
                attention_type,
                attention_dropout=attention_dropout,
                softmax_scale=softmax_scale,
                cp_comm_type=cp_comm_type,
                pg_collection=pg_collection,
            )

    class _CPUGroupedLinear(MegatronModule):
        """CPU stand-in for TEGroupedLinear: weight{i}/bias{i} per local expert."""

        parallel_mode: str = ""

        def __init__(
            self,
            num_gemms,
            input_size,
            output_size,
            *,
            config,
            init_method,
            bias,
            skip_bias_add,
            is_expert,
            tp_comm_buffer_name=None,
            pg_collection=None,
            name=None,
        ):
            super().__init__(config=config)
            self.num_gemms = num_gemms
            self._pg_collection = pg_collection
            self._tp_group = pg_collection.expt_tp
            tp = get_pg_size(self._tp_group)
            if self.parallel_mode == "column":
                out_f, in_f = output_size // tp, input_size
            else:
                out_f, in_f = output_size, input_size // tp
            self.in_features, self.out_features = in_f, out_f
            self.use_bias = bias
            self.te_return_bias = skip_bias_add and bias
            for i in range(num_gemms):
                w = Parameter(torch.empty(out_f, in_f, dtype=config.params_dtype))
                if config.perform_initialization:
                    init_method(w)
                self.register_parameter(f"weight{i}", w)
                if bias:
                    self.register_parameter(
                        f"bias{i}", Parameter(torch.zeros(out_f, dtype=config.params_dtype))
                    )

        def forward(self, x, m_splits):
            chunks = torch.split(x, list(m_splits))
            outs = [
                F.linear(
                    c,
                    getattr(self, f"weight{i}"),
                    None
                    if (self.te_return_bias or not self.use_bias)
                    else getattr(self, f"bias{i}"),
                )
                for i, c in enumerate(chunks)
            ]
            out = torch.cat(outs) if outs else x.new_zeros(0, self.out_features)
            if self.te_return_bias:
                return out, [getattr(self, f"bias{i}") for i in range(self.num_gemms)]
            return out, None

        def _sharded_state_dict_grouped(
            self, tp_axis_map, prefix="", sharded_offsets=(), metadata=None
        ):
            # as megatron.core.extensions.transformer_engine.TEGroupedLinear, minus _extra_state
            metadata = metadata or {}
            singleton_local_shards = metadata.get("singleton_local_shards", False)
            full = self.state_dict(prefix="", keep_vars=True)
            ep = self._pg_collection.ep
            num_global_experts = get_pg_size(ep) * self.num_gemms
            offset = get_pg_rank(ep) * self.num_gemms
            ep_axis = len(sharded_offsets)
            out = {}
            for i in range(self.num_gemms):
                g = offset + i
                sd = {f"{i}.weight": full[f"weight{i}"]}
                if self.use_bias:
                    sd[f"{i}.bias"] = full[f"bias{i}"]
                if singleton_local_shards:
                    expert_prefix, offs = f"{g}.{prefix}", sharded_offsets
                else:
                    expert_prefix = prefix
                    offs = (*sharded_offsets, (ep_axis, g, num_global_experts))
                sub = make_sharded_tensors_for_checkpoint(
                    sd,
                    "",
                    tp_axis_map,
                    offs,
                    tp_group=self._tp_group,
                    dp_cp_group=metadata.get("dp_cp_group"),
                )
                replace_prefix_for_sharding(sub, f"{i}.", expert_prefix)
                out[f"{prefix}weight{i}"] = sub[f"{i}.weight"]
                if self.use_bias:
                    out[f"{prefix}bias{i}"] = sub[f"{i}.bias"]
            for sh in out.values():
                rid = sh.replica_id
                edp = (
                    get_pg_rank(self._pg_collection.expt_dp_gtp_remat)
                    if isinstance(sh, ShardedObject)
                    else get_pg_rank(self._pg_collection.expt_dp)
                )
                sh.replica_id = (*rid[:2], edp)
            return out

    class TEColumnParallelGroupedLinear(_CPUGroupedLinear):
        parallel_mode = "column"

        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            axis = {}
            for i in range(self.num_gemms):
                axis.update({f"{i}.weight": 0, f"{i}.bias": 0})
            return self._sharded_state_dict_grouped(axis, prefix, sharded_offsets, metadata)

    class TERowParallelGroupedLinear(_CPUGroupedLinear):
        parallel_mode = "row"

        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            axis = {f"{i}.weight": 1 for i in range(self.num_gemms)}
            return self._sharded_state_dict_grouped(axis, prefix, sharded_offsets, metadata)

    class CPUTESpecProvider(BackendSpecProvider):
        """TESpecProvider's interface, answering with the CPU stand-ins above."""

        def linear(self):
            return TELinear

        def column_parallel_linear(self):
            return TEColumnParallelLinear

        def row_parallel_linear(self):
            return TERowParallelLinear

        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return TELayerNormColumnParallelLinear

        def layer_norm(self, rms_norm=False, for_qk=False, has_residual=False):
            return TENorm

        def core_attention(self):
            return TEDotProductAttention

        def grouped_mlp_modules(self, moe_use_grouped_gemm):
            if moe_use_grouped_gemm:
                return partial(
                    TEGroupedMLP,
                    submodules=GroupedMLPSubmodules(
                        linear_fc1=TEColumnParallelGroupedLinear,
                        linear_fc2=TERowParallelGroupedLinear,
                        activation_func=None,
                    ),
                )
            return partial(
                SequentialMLP,
                submodules=MLPSubmodules(
                    linear_fc1=TEColumnParallelLinear,
                    linear_fc2=TERowParallelLinear,
                    activation_func=None,
                ),
            )

        def activation_func(self):
            return None

    # 1. the TE extension module itself (for every later `from ... import TEXxx`)
    stand_ins = {
        "TENorm": TENorm,
        "TELinear": TELinear,
        "TEColumnParallelLinear": TEColumnParallelLinear,
        "TERowParallelLinear": TERowParallelLinear,
        "TELayerNormColumnParallelLinear": TELayerNormColumnParallelLinear,
        "TEDotProductAttention": TEDotProductAttention,
        "TEColumnParallelGroupedLinear": TEColumnParallelGroupedLinear,
        "TERowParallelGroupedLinear": TERowParallelGroupedLinear,
        # mcore-bridge only: patcher._patch_TEGroupedLinear sets TEGroupedLinear.sharded_state_dict
        # at import time and model/register.py tests isinstance(module, TEGroupedLinear); without
        # TE megatron-core binds it to None.  The base of the two grouped stand-ins above.
        "TEGroupedLinear": _CPUGroupedLinear,
    }
    for name, cls in stand_ins.items():
        setattr(te_ext, name, cls)
    import megatron.core.extensions.transformer_engine_spec_provider as te_spec_mod

    for name, cls in stand_ins.items():
        if hasattr(te_spec_mod, name):
            setattr(te_spec_mod, name, cls)
    te_spec_mod.TESpecProvider = CPUTESpecProvider
    # 2. modules that bound None under `if HAVE_TE:` at import time: import the ones the model
    #    builders use now, then give every loaded megatron module whose TE name is None the
    #    stand-in (sweep_te_names runs again once the bridge has imported its model packages).
    import megatron.core.models.gpt.experimental_attention_variant_module_specs as eav
    import megatron.core.models.gpt.gpt_layer_specs as gls
    import megatron.core.models.gpt.moe_module_specs as moe_specs
    import megatron.core.transformer.attention  # noqa: F401
    import megatron.core.transformer.moe.moe_layer  # noqa: F401
    import megatron.core.transformer.multi_latent_attention  # noqa: F401
    import megatron.core.transformer.multi_token_prediction as mtp_mod
    import megatron.core.transformer.transformer_block as tblock
    from megatron.core.transformer.moe.experts import (  # used by CPUTESpecProvider
        GroupedMLPSubmodules,
        SequentialMLP,
        TEGroupedMLP,
    )

    try:
        import megatron.core.transformer.experimental_attention_variant.absorbed_mla  # noqa: F401
    except ImportError:
        pass
    for mod in (gls, eav, moe_specs, mtp_mod):
        mod.TESpecProvider = CPUTESpecProvider
    tblock.LayerNormImpl = TENorm
    _TE_STAND_INS.update(stand_ins)
    _TE_STAND_INS["TESpecProvider"] = CPUTESpecProvider
    sweep_te_names()
    SHIMS_APPLIED.append("cpu-te-backend")


# SHIM cpu-config-settings: ModelConfig fields that only select CUDA kernels/streams.
# (the list of tests/thirdparty/megatron_bridge_062/convert.py _cpu_provider_overrides)
#   * fused CUDA/TE/APEX kernels: moe_permute_fusion, moe_router_fusion, persist_layer_norm,
#     gradient_accumulation_fusion, bias_*_fusion, masked_softmax_fusion, apply_rope_fusion;
#   * moe_shared_expert_overlap: overlaps on a CUDA stream;
#   * moe_token_dispatcher_type 'alltoall' (mcore-bridge's default; megatron-core 0.19.2 creates
#     torch.cuda.Stream() in its constructor) / 'flex' (DeepEP, CUDA only) -> 'allgather'.
#     A dispatcher has no parameters and only runs in forward.  With it, variable_seq_lengths
#     False (see cpu_config_overrides).
# moe_grouped_gemm is left as mcore-bridge sets it (True): the CPU grouped linear of
# shim_cpu_te_backend builds TEGroupedMLP's layout (linear_fc1.weight{i}).
CPU_FALSE_FIELDS = (
    "moe_permute_fusion",
    "moe_router_fusion",
    "persist_layer_norm",
    "gradient_accumulation_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "apply_rope_fusion",
    "moe_shared_expert_overlap",
)


def cpu_config_overrides(config_cls, kwargs: dict) -> list[str]:
    """Add the CPU settings to the ModelConfig kwargs; returns "name:old->new" for each field
    whose value (the kwargs' or the dataclass default) it changes."""
    import dataclasses

    defaults = {}
    for f in dataclasses.fields(config_cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            defaults[f.name] = f.default_factory()  # type: ignore[misc]
    changed = []

    def setf(name, value):
        if name not in defaults and name not in kwargs:
            return
        old = kwargs.get(name, defaults.get(name))
        if old != value:
            changed.append(f"{name}:{old!r}->{value!r}")
        kwargs[name] = value

    for name in CPU_FALSE_FIELDS:
        setf(name, False)
    if kwargs.get("moe_token_dispatcher_type", defaults.get("moe_token_dispatcher_type")) in (
        "flex",
        "alltoall",
    ):
        setf("moe_token_dispatcher_type", "allgather")
        # megatron-core refuses allgather with variable_seq_lengths ("Token dispatcher type:
        # allgather does not support variable sequence length, please use alltoall dispatcher
        # instead."); mcore-bridge defaults it to True.  It only selects how pipeline stages
        # exchange activation shapes in forward (pipeline size is 1 here).
        if kwargs.get("num_moe_experts"):
            setf("variable_seq_lengths", False)
    # build the weights on CPU (megatron-core's use_cpu_initialization); values are overwritten
    # by load_weights / the checkpoint load anyway
    setf("use_cpu_initialization", True)
    return changed


def shim_saver_host_copy() -> None:
    """SHIM saver-host-copy: ``StreamingSafetensorSaver.add_tensor`` stores a copy of the tensor.

    The saver keeps ``tensor.cpu().contiguous()``; on a GPU that is a fresh host copy for every
    exported name.  On CPU it is the model's own parameter, so when the bridge exports one
    Megatron parameter under two HF names (DeepSeek-V3 / GLM-4.5 MTP: ``embedding.word_embeddings``
    -> ``model.embed_tokens.weight`` and ``model.layers.{N}.embed_tokens.weight``; ``output_layer``
    -> ``lm_head.weight`` and ``model.layers.{N}.shared_head.head.weight``,
    GPTBridge._convert_mtp_embeds) both names hold the same storage and safetensors' save_file
    refuses it ("RuntimeError: Some tensors share memory, this will lead to duplicate memory on
    disk ...").  ``clone()`` gives each name its own storage, as the device-to-host copy does;
    the bytes are the same.
    """
    from mcore_bridge.utils import safetensors as mcb_st

    orig = mcb_st.StreamingSafetensorSaver.add_tensor

    def add_tensor(self, name, tensor):
        return orig(self, name, tensor.detach().clone() if tensor is not None else tensor)

    mcb_st.StreamingSafetensorSaver.add_tensor = add_tensor
    SHIMS_APPLIED.append("saver-host-copy")


def install_runtime_shims(info: dict) -> None:
    shim_torch_cuda()
    shim_cuda_device_to_cpu()
    shim_cpu_rng_tracker()
    shim_cpu_te_backend()
    import mcore_bridge  # noqa: F401  (runs mcore_bridge.patcher.apply_patch)
    from mcore_bridge import model as _m  # noqa: F401  (imports and registers every model)

    shim_saver_host_copy()

    info["te_names_swept"] = sweep_te_names()


# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def distributed_context():
    """World size 1 on gloo, every parallel size 1 (as ms-swift's _initialize_mpu, minus CUDA)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    dist.init_process_group(backend="gloo", rank=0, world_size=1)
    try:
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=1,
            expert_model_parallel_size=1,
            expert_tensor_parallel_size=1,
        )
        yield
    finally:
        with contextlib.suppress(Exception):
            mpu.destroy_model_parallel()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _torch_dtype(hf_config):
    import torch

    for c in (hf_config, getattr(hf_config, "text_config", None)):
        d = getattr(c, "dtype", None) or getattr(c, "torch_dtype", None) if c is not None else None
        if d is not None:
            return d if isinstance(d, torch.dtype) else getattr(torch, str(d).replace("torch.", ""))
    return torch.bfloat16


# FIXTURE: config keys mcore-bridge reads that the shipped fixtures (written in transformers 5.24's
# schema) lack, while the hub checkpoints it was written for carry them.  Each function fills in
# what is missing on the loaded config object and returns what it added (recorded in
# convert.json as "fixture_config_defaults").
def _fix_full_attention_interval(c) -> dict:
    # hf_to_mcore_config maps only `full_attention_interval` to linear_attention_freq for
    # qwen3_next / qwen3_5 / qwen3_5_moe and otherwise defaults it to 4 (config/parser.py
    # `res.setdefault('linear_attention_freq', 4)`); `layer_types` is ignored for them.  Hub
    # Qwen3-Next / Qwen3.5 configs carry full_attention_interval: 4; the fixtures carry only
    # layer_types.  Derived: the interval n with layer i full attention iff (i + 1) % n == 0.
    lt = getattr(c, "layer_types", None)
    if getattr(c, "full_attention_interval", None) is not None or not lt:
        return {}
    for n in range(1, len(lt) + 1):
        if all((t == "full_attention") == ((i + 1) % n == 0) for i, t in enumerate(lt)):
            c.full_attention_interval = n
            return {"full_attention_interval": n}
    return {}


def _fix_hy_v3(c) -> dict:
    # hf_to_mcore_config reads `first_k_dense_replace` / `moe_layer_start_index` for the leading
    # dense layers; transformers' HYV3Config (the fixture) has `mlp_layer_types` instead.  Without
    # it every layer is built as MoE and load_weights fails on the dense layer 0 ("KeyError:
    # 'router.gate.weight'").  Derived: the number of leading "dense" entries (the fix of the
    # Megatron-Bridge harness, same key).
    if getattr(c, "first_k_dense_replace", None) is not None or not getattr(
        c, "mlp_layer_types", None
    ):
        return {}
    n = 0
    for kind in c.mlp_layer_types:
        if kind != "dense":
            break
        n += 1
    c.first_k_dense_replace = n
    return {"first_k_dense_replace": n}


def _fix_deepseek_v3(c) -> dict:
    # hf_to_mcore_config takes the router score function from `scoring_func` (else softmax) and
    # enables the expert bias (e_score_correction_bias) only for sigmoid.  Hub DeepSeek-V3
    # configs carry "scoring_func": "sigmoid" (transformers' DeepseekV3Config hard-codes sigmoid
    # routing and does not write the key, so the fixture lacks it).  Without it the bridge builds
    # a softmax router without expert bias and e_score_correction_bias is dropped (see NOTES.md).
    if getattr(c, "scoring_func", None) is not None:
        return {}
    c.scoring_func = "sigmoid"
    return {"scoring_func": "sigmoid"}


FIXTURE_CONFIG_FIXES = {
    "deepseek_v3": _fix_deepseek_v3,
    "hy_v3": _fix_hy_v3,
    "qwen3_next": _fix_full_attention_interval,
    "qwen3_5_text": _fix_full_attention_interval,
    "qwen3_5_moe_text": _fix_full_attention_interval,
}


def fixture_config_defaults(hf_config, info: dict) -> None:
    added = {}
    for c in (hf_config, getattr(hf_config, "text_config", None)):
        fix = FIXTURE_CONFIG_FIXES.get(getattr(c, "model_type", None)) if c is not None else None
        if fix:
            added.update({f"{c.model_type}.{k}": v for k, v in fix(c).items()})
    if added:
        info["fixture_config_defaults"] = added


def build_models(fixture: str, mtp_num_layers: int | None, info: dict, tag: str):
    """ms-swift's get_mcore_model(args, hf_config) for `--model FIXTURE [--mtp_num_layers N]`."""
    from mcore_bridge import ModelConfig, get_mcore_model, hf_to_mcore_config
    from mcore_bridge.model import get_mcore_model_type, get_model_meta
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(fixture, trust_remote_code=True)
    if not os.environ.get("MCB_NO_FIXTURE_FIXES"):
        fixture_config_defaults(hf_config, info)
    kwargs = hf_to_mcore_config(hf_config)
    hf_model_type = kwargs.get("hf_model_type")
    mcore_model_type = get_mcore_model_type(hf_model_type)
    meta = get_model_meta(mcore_model_type) if mcore_model_type else None
    info[f"{tag}_hf_model_type"] = hf_model_type
    info["mcore_model_type"] = mcore_model_type
    if meta is None:
        # ms-swift stops earlier (no megatron model meta for the HF model_type); ModelConfig
        # itself would fail with "'NoneType' object has no attribute 'visual_cls'"
        raise ValueError(
            f"mcore-bridge registers no model for HF model_type {hf_model_type!r} "
            f"(get_mcore_model_type({hf_model_type!r}) is None)"
        )
    config_cls = getattr(meta, "config_cls", ModelConfig)
    info["config_cls"] = config_cls.__name__
    info["bridge"] = meta.bridge_cls.__name__
    info["loader"] = getattr(meta.loader, "__name__", str(meta.loader))
    kwargs["mcore_model_type"] = meta.model_type
    kwargs["hf_config"] = hf_config
    kwargs["params_dtype"] = _torch_dtype(hf_config)
    if mtp_num_layers is not None:
        kwargs["mtp_num_layers"] = mtp_num_layers
    info[f"{tag}_cpu_config_overrides"] = cpu_config_overrides(config_cls, kwargs)
    info[f"{tag}_hf_to_mcore_config"] = {
        k: (v if isinstance(v, (int, float, str, bool, type(None), list)) else repr(v))
        for k, v in kwargs.items()
        if k != "hf_config"
    }
    config = config_cls(**kwargs)
    info[f"{tag}_mtp_num_layers"] = config.mtp_num_layers
    models = get_mcore_model(config)
    return hf_config, config, models


def _sharded_sd_metadata():
    # ms-swift get_sharded_sd_metadata(args) with its defaults (torch >= 2.6, no FSDP,
    # dist_ckpt_optim_fully_reshardable False)
    return {
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "distrib_optim_sharding_type": "dp_reshardable",
    }


ITERATION = 1  # ms-swift's save_mcore_checkpoint(iteration=1) in convert_hf2mcore


def save_mcore_checkpoint(models, megatron_dir: str, args: dict) -> None:
    """ms-swift 4.6 save_mcore_checkpoint for one model chunk, no optimizer, no RNG (export
    saves with no_save_optim/no_save_rng): dist_checkpointing.save with TorchDistSaveShardedStrategy
    wrapped in FullyParallelSaveStrategyWrapper, content_metadata, then
    latest_checkpointed_iteration.txt.  args.json is ms-swift's args.save_args(output_dir)."""
    import copy
    from argparse import Namespace

    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    os.makedirs(megatron_dir, exist_ok=True)
    with open(os.path.join(megatron_dir, "args.json"), "w") as f:
        json.dump(args, f, indent=1)
    ckpt = os.path.join(megatron_dir, f"iter_{ITERATION:07d}")
    os.makedirs(ckpt, exist_ok=True)
    md = _sharded_sd_metadata()
    state_dict = {
        "args": Namespace(**args),
        "checkpoint_version": 3.0,
        "iteration": ITERATION,
        "model": models[0].sharded_state_dict(metadata=md),
    }
    content_metadata = {k: v for k, v in md.items() if k != "dp_cp_group"}

    def preprocess(common):
        c = copy.deepcopy(common)
        c["args"] = vars(c["args"])
        return c

    strategy = FullyParallelSaveStrategyWrapper(
        TorchDistSaveShardedStrategy(), mpu.get_data_parallel_group(with_context_parallel=True)
    )
    dist_checkpointing.save(
        state_dict,
        ckpt,
        strategy,
        validate_access_integrity=True,
        preprocess_common_before_consistancy_check=preprocess,
        content_metadata=content_metadata,
    )
    dist.barrier()
    with open(os.path.join(megatron_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def load_mcore_checkpoint(models, megatron_dir: str) -> None:
    """ms-swift 4.6 load_mcore_checkpoint(load_arg='mcore_model') for a full model, finetune-style
    (no optimizer, no RNG): dist_checkpointing.load with TorchDistLoadShardedStrategy wrapped in
    FullyParallelLoadStrategyWrapper, then
    model.load_state_dict(state_dict['model'], strict=False)."""
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as mpu
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper,
    )
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy

    with open(os.path.join(megatron_dir, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read())
    ckpt = os.path.join(megatron_dir, f"iter_{iteration:07d}")
    common = dist_checkpointing.load_common_state_dict(ckpt)
    md = common.get("content_metadata")
    sharded = {"model": models[0].sharded_state_dict(metadata=md)}
    strategy = FullyParallelLoadStrategyWrapper(
        TorchDistLoadShardedStrategy(), mpu.get_data_parallel_group(with_context_parallel=True)
    )
    state_dict = dist_checkpointing.load(sharded, ckpt, strategy)
    result = models[0].load_state_dict(state_dict["model"], strict=False)
    return {
        "missing_keys": list(getattr(result, "missing_keys", []) or []),
        "unexpected_keys": list(getattr(result, "unexpected_keys", []) or []),
    }


def do_import(fixture: str, megatron_dir: str, mtp_num_layers: int | None, info: dict) -> None:
    with distributed_context():
        _, config, models = build_models(fixture, mtp_num_layers, info, "import")
        info["import_model_has_mtp"] = getattr(models[0], "mtp", None) is not None
        config.bridge.load_weights(models, fixture)
        save_mcore_checkpoint(
            models,
            megatron_dir,
            {
                "model": fixture,
                "mtp_num_layers": mtp_num_layers,
                "torch_dtype": str(config.params_dtype).replace("torch.", ""),
                "tensor_model_parallel_size": 1,
                "pipeline_model_parallel_size": 1,
                "no_save_optim": True,
                "no_save_rng": True,
            },
        )


def _text_config(hf_config):
    # ms-swift HfConfigFactory.get_text_config: the nested text config when there is one
    for name in ("text_config", "llm_config", "language_config", "thinker_config"):
        c = getattr(hf_config, name, None)
        if c is not None:
            return c
    return hf_config


def do_export(fixture: str, megatron_dir: str, hf_dir: str, info: dict) -> None:
    import copy

    with open(os.path.join(megatron_dir, "args.json")) as f:
        saved = json.load(f)
    with distributed_context():
        hf_config, config, models = build_models(
            fixture, saved.get("mtp_num_layers"), info, "export"
        )
        info["export_model_has_mtp"] = getattr(models[0], "mtp", None) is not None
        info["export_load_state_dict"] = load_mcore_checkpoint(models, megatron_dir)
        config.bridge.save_weights(models, hf_dir)
        # ms-swift's patched GPTBridge.save_weights (swift/megatron/init.py _patch_mcore_bridge):
        # the HF config with the MTP count rewritten from config.mtp_num_layers when it is set
        hf_config = copy.deepcopy(hf_config)
        llm_config = _text_config(hf_config)
        if config.mtp_num_layers:
            for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
                if hasattr(llm_config, key):
                    setattr(llm_config, key, config.mtp_num_layers)
                    break
            else:
                llm_config.num_nextn_predict_layers = config.mtp_num_layers
        if hasattr(hf_config, "quantization_config"):
            delattr(hf_config, "quantization_config")
        hf_config.save_pretrained(hf_dir)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def get(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    pkgs = ("torch", "megatron-core", "mcore-bridge", "transformers", "peft", "safetensors")
    return {"python": sys.version.split()[0], **{p: get(p) for p in pkgs}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fixture")
    ap.add_argument("out")
    ap.add_argument("--mtp-num-layers", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=900, help="abort after this many seconds")
    ap.add_argument("-v", "--verbose", action="store_true", help="library output to the terminal")
    args = ap.parse_args(argv)

    fixture = os.path.abspath(args.fixture)
    out = os.path.abspath(args.out)
    meg_dir, hf_dir = os.path.join(out, "megatron"), os.path.join(out, "hf")
    for d in (meg_dir, hf_dir):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="mcb_", dir="/tmp")
    _setup_env(tmp)
    os.environ.setdefault("MODELSCOPE_CACHE", os.path.join(tmp, "modelscope"))
    log_path = os.path.join(out, "convert.log")
    info: dict = {
        "fixture": os.path.basename(fixture.rstrip("/")),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "mtp_num_layers_arg": args.mtp_num_layers,
        "versions": None,
        "shims": SHIMS_APPLIED,
        "steps": [],
        "ok": False,
        "error": None,
    }

    saved_out, saved_err = os.dup(1), os.dup(2)
    if not args.verbose:  # fd level, so the checkpoint writer's child processes are covered too
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def finish(code: int) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        with open(os.path.join(out, "convert.json"), "w") as f:
            json.dump(info, f, indent=1, default=str)
            f.write("\n")
        shutil.rmtree(tmp, ignore_errors=True)
        msg = "ok" if info["ok"] else f"FAILED: {info['error']}"
        print(
            f"convert.py {info['fixture']}: {msg} ({sum(s['seconds'] for s in info['steps']):.1f}s)"
        )
        return code

    def on_timeout():
        info["error"] = f"TimeoutError: convert.py gave up after {args.timeout:.0f}s"
        finish(3)
        os._exit(3)

    watchdog = threading.Timer(args.timeout, on_timeout)
    watchdog.daemon = True
    watchdog.start()

    step = None
    try:
        shim_import_stubs()
        info["versions"] = _versions()
        for step, fn in (
            ("shims", lambda: install_runtime_shims(info)),
            ("import", lambda: do_import(fixture, meg_dir, args.mtp_num_layers, info)),
            ("export", lambda: do_export(fixture, meg_dir, hf_dir, info)),
        ):
            t0 = time.time()
            rec = {"step": step, "ok": False, "seconds": None}
            info["steps"].append(rec)
            try:
                fn()
                rec["ok"] = True
            finally:
                rec["seconds"] = round(time.time() - t0, 2)
        info["ok"] = True
        code = 0
    except BaseException as e:  # noqa: B036 - record everything, including SystemExit
        traceback.print_exc()
        one_line = " ".join(f"{type(e).__name__}: {e}".split())
        info["error"] = f"[{step}] {one_line}"[:1500]
        code = 1
    watchdog.cancel()
    return finish(code)


if __name__ == "__main__":  # required: mcore's torch_dist writer may spawn worker processes
    sys.exit(main())
