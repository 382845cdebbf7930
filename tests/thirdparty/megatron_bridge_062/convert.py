#!/usr/bin/env python3
"""HF -> Megatron (torch_dist) -> HF round trip with the real Megatron-Bridge 0.6.2, on CPU.

    /work/venvs/mb062/bin/python convert.py FIXTURE_DIR OUT_DIR [--mtp-num-layers N]

Writes
  OUT_DIR/megatron/   what AutoBridge.save_megatron_model writes (iter_0000000/, torch_dist)
  OUT_DIR/hf/         what AutoBridge.export_ckpt writes back from that checkpoint
  OUT_DIR/convert.json versions, the steps that ran, seconds, and any exception in one line

The conversion is Megatron-Bridge's own public API and nothing else:
  import: AutoBridge.from_hf_pretrained(FIXTURE) -> to_megatron_provider(load_weights=True)
          -> provider.finalize() -> provide_distributed_model(wrap_with_ddp=False,
          use_cpu_initialization=True) -> AutoBridge.save_megatron_model(..., low_memory_save=True)
          (this is AutoBridge.import_ckpt() split in two so that the CPU settings of
          _cpu_provider_overrides() reach the provider before the model is built)
  export: AutoBridge.from_hf_pretrained(FIXTURE).export_ckpt(OUT_DIR/megatron, OUT_DIR/hf)

--mtp-num-layers N sets provider.mtp_num_layers = N (a public provider field) after the model
bridge's provider_bridge() ran, i.e. it overrides whatever the bridge derived from config.json
(None/0 when the bridge ignores or lacks the key).  The value then travels in the checkpoint's
run_config.yaml, so export builds the same model.  Without the option the bridge's own value is
used unchanged.

Shims: the functions named shim_* (import-stubs, torch-cuda, cpu-rng-tracker, cpu-te-backend,
export-provider, bridge-te-spec) and _cpu_provider_overrides().  Each replaces a CUDA-only or
Transformer-Engine-only call, module or kernel with plain torch, or turns a CUDA-only *setting*
off.  None of them reads, writes or reorders a weight; nothing inside the installed packages is
edited (monkeypatches in this process only).  convert.json lists the shims applied and every
provider field changed.

Fixture config fixes (FIXTURE_CONFIG_FIXES): a few bridges read config keys that the shipped
fixtures (written in transformers 5.24's schema) lack; the missing keys are filled in on the
loaded config object and listed in convert.json under "fixture_config_defaults".

Tested with: Python 3.12.1, torch 2.13.0 (PyPI, CUDA 13 build, run on CPU), megatron-core
0.19.2 and megatron-bridge 0.6.2 (both --no-deps), transformers 5.18.0 (see install_venv.sh for
why not the 5.12.1 the bridge declares), fla-core/flash-linear-attention 0.4.2, mamba-ssm
2.3.2.post1 (built with MAMBA_SKIP_CUDA_BUILD=TRUE), nvidia-modelopt 0.47.0 (--no-deps).
"""

from __future__ import annotations

import argparse
import builtins
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


def shim_import_stubs() -> None:
    """SHIM import-stubs: serve placeholder modules to the few importers that need them.

    Only the named importing modules see the stub; for every other module the package stays
    absent, so megatron-core and the bridge keep HAVE_TE=False and pick their non-TE paths.
    No stubbed object is ever called during conversion (calling one raises).

    * ``transformer_engine`` <- ``megatron.bridge.peft.*``: ``lora_layers.py`` does an
      unconditional ``import transformer_engine.pytorch as te`` (LoRA classes only; imported by
      ``megatron.bridge.__init__`` through the model bridges).
    * ``datasets`` <- ``megatron.bridge.data.*``: SFT/HF dataset builders, imported by the
      training package that ``model_load_save`` lives in (avoids pyarrow + pandas).
    * ``megatron.energon`` <- ``megatron.bridge.data.*``: multimodal data loaders, same import
      chain (``training.config`` -> ``bridge.data.builders.energon``).
    * ``torch.utils.tensorboard`` <- ``megatron.bridge.training.state``: ``SummaryWriter`` for
      training logs (avoids the tensorboard package).
    * ``selective_scan_cuda`` <- ``mamba_ssm.ops.selective_scan_interface``: the CUDA extension of
      mamba-ssm (installed with MAMBA_SKIP_CUDA_BUILD=TRUE, so it is not built).  mamba_ssm's
      ``__init__`` imports it unconditionally; megatron-core's MambaMixer only needs the
      pure-Python/Triton ``layernorm_gated.RMSNorm`` and ``ssd_combined`` modules at build time.
    """
    _STUBS["transformer_engine"] = (_stub_module("transformer_engine"), ("megatron.bridge.peft.",))
    _STUBS["datasets"] = (_stub_module("datasets"), ("megatron.bridge.data.",))
    _STUBS["megatron.energon"] = (_stub_module("megatron.energon"), ("megatron.bridge.data.",))
    _STUBS["selective_scan_cuda"] = (
        _stub_module("selective_scan_cuda"),
        ("mamba_ssm.ops.selective_scan_interface",),
    )
    _STUBS["torch.utils.tensorboard"] = (
        _stub_module("torch.utils.tensorboard"),
        ("megatron.bridge.training.state",),
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

    Megatron-Bridge 0.6.2 always builds the Transformer-Engine layer spec
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


def _cpu_provider_overrides(p) -> list[str]:
    """SHIM cpu-provider-settings: settings that only select CUDA kernels; no effect on keys/values.

    * ``moe_permute_fusion`` / ``moe_router_fusion`` / ``persist_layer_norm`` /
      ``gradient_accumulation_fusion`` / ``bias_*_fusion`` / ``masked_softmax_fusion`` /
      ``apply_rope_fusion``: fused CUDA/TE/APEX kernels;
    * ``moe_shared_expert_overlap``: overlaps on a CUDA stream;
    * ``moe_token_dispatcher_type`` ``flex`` (DeepEP/HybridEP, CUDA only) or ``alltoall``
      (megatron-core 0.19.2 creates ``torch.cuda.Stream()`` in its constructor) ->
      ``allgather``.  A dispatcher has no parameters and only runs in forward.
    ``moe_grouped_gemm`` is left as the bridge set it: the CPU grouped linear of
    shim_cpu_te_backend builds TEGroupedMLP's layout.
    Returns the fields it changed, as "name:old->new".
    """
    changed = []

    def setf(name, value):
        if hasattr(p, name) and getattr(p, name) != value:
            changed.append(f"{name}:{getattr(p, name)!r}->{value!r}")
            setattr(p, name, value)

    for name in (
        "moe_permute_fusion",
        "moe_router_fusion",
        "persist_layer_norm",
        "gradient_accumulation_fusion",
        "bias_activation_fusion",
        "bias_dropout_fusion",
        "masked_softmax_fusion",
        "apply_rope_fusion",
        "moe_shared_expert_overlap",
    ):
        setf(name, False)
    if getattr(p, "moe_token_dispatcher_type", None) in ("flex", "alltoall"):
        setf("moe_token_dispatcher_type", "allgather")
    return changed


def shim_export_provider() -> None:
    """SHIM export-provider: apply _cpu_provider_overrides() to the provider that export_ckpt
    rebuilds from the checkpoint's run_config.yaml (training.model_load_save.load_model_config)."""
    import megatron.bridge.training.model_load_save as mls

    orig = mls.load_model_config

    def load_model_config(*a, **k):
        cfg, mlm_args = orig(*a, **k)
        _cpu_provider_overrides(cfg)
        return cfg, mlm_args

    mls.load_model_config = load_model_config
    SHIMS_APPLIED.append("export-provider")


def shim_bridge_te_spec_selection() -> list[str]:
    """SHIM bridge-te-spec: ``HAVE_TE = True`` for bridges that choose the layer spec with
    ``use_transformer_engine=HAVE_TE``.

    DeepSeek-V2/V3, GLM-4.5, GLM-4.7-Flash, HY-V3, Bailing, MiniMax-M3, Kimi, EXAONE-MoE, ... set
    ``provider.transformer_layer_spec = partial(get_gpt_decoder_block_spec,
    use_transformer_engine=HAVE_TE)`` where ``HAVE_TE`` is ``import transformer_engine``
    succeeding.  On the GPU machines the bridge is made for that is True; here it would silently
    pick megatron-core's *local* spec, whose parameter names differ (``input_layernorm.weight``
    instead of ``self_attention.linear_qkv.layer_norm_weight``, ``experts.local_experts.{i}``
    instead of ``experts.linear_fc1.weight{i}``).  Setting the module flag makes the CPU run build
    the same TE layout as a GPU run (with the stand-ins of shim_cpu_te_backend).  Only modules
    whose source contains ``use_transformer_engine=HAVE_TE`` are touched; returns their names.
    """
    import inspect

    import megatron.bridge  # noqa: F401  (imports every model bridge)

    flipped = []
    for name, mod in sorted(sys.modules.items()):
        if (
            not name.startswith("megatron.bridge.models.")
            or getattr(mod, "HAVE_TE", None) is not False
        ):
            continue
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            continue
        if "use_transformer_engine=HAVE_TE" in src:
            mod.HAVE_TE = True
            flipped.append(name)
    SHIMS_APPLIED.append("bridge-te-spec")
    sweep_te_names()
    return flipped


def install_runtime_shims(info: dict) -> None:
    shim_torch_cuda()
    shim_cpu_rng_tracker()
    shim_cpu_te_backend()
    shim_export_provider()
    info["bridge_te_spec_modules"] = shim_bridge_te_spec_selection()


# ----------------------------------------------------------------------------------------------
def _has_tokenizer(hf_dir: str) -> bool:
    return any(
        os.path.exists(os.path.join(hf_dir, f))
        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


# FIXTURE: config keys a bridge reads unconditionally that the shipped fixture's config.json
# (written in transformers 5.24's schema) lacks, while the hub checkpoints the bridge was
# written for carry them.  Keyed by config class name; each function fills in what is missing
# on the loaded config object and returns what it added (recorded in convert.json as
# "fixture_config_defaults").  None of these keys shapes or names a weight.
def _fix_glm5(c) -> dict:
    # GLM5Bridge.provider_bridge reads `indexer_rope_interleave` (zai-org GLM-5 configs:
    # true); only the DSA indexer's RoPE layout in forward.
    if not hasattr(c, "indexer_rope_interleave"):
        c.indexer_rope_interleave = True
        return {"indexer_rope_interleave": True}
    return {}


def _fix_hy_v3(c) -> dict:
    # HYV3Bridge.provider_bridge reads `first_k_dense_replace`; transformers' HYV3Config has
    # `mlp_layer_types` instead.  Derived: the number of leading "dense" entries.
    if hasattr(c, "first_k_dense_replace") or not getattr(c, "mlp_layer_types", None):
        return {}
    n = 0
    for kind in c.mlp_layer_types:
        if kind != "dense":
            break
        n += 1
    c.first_k_dense_replace = n
    return {"first_k_dense_replace": n}


def _fix_deepseek_v4(c) -> dict:
    # DeepSeekV4Bridge.provider_bridge reads the YaRN keys `factor` and
    # `original_max_position_embeddings` of the compressed-attention RoPE (hub DeepSeek-V4:
    # 16 and 65536); the fixture has rope_type "default" without them.  RoPE only.
    rp = getattr(c, "rope_parameters", None) or {}
    comp = rp.get("compress", rp) if isinstance(rp, dict) else None
    added = {}
    if isinstance(comp, dict):
        for key, value in (("factor", 16.0), ("original_max_position_embeddings", 65536)):
            if key not in comp:
                comp[key] = value
                added[f"rope_parameters.compress.{key}"] = value
    return added


def _fix_step3p7_vision(c) -> dict:
    # Step37Bridge registers its own Step37VisionConfig (the remote-code schema: `width`,
    # `heads`, `layers`, defaults 1536/16/47 = the hub encoder).  The fixture's vision_config is
    # in transformers' Step3p7VisionConfig schema (`hidden_size`, `num_attention_heads`,
    # `num_hidden_layers`), which that class keeps as plain attributes next to the defaults.
    # Copy the fixture's values onto the remote-code names.
    added = {}
    for new, old in (
        ("width", "hidden_size"),
        ("heads", "num_attention_heads"),
        ("layers", "num_hidden_layers"),
    ):
        val = c.__dict__.get(old)
        if val is not None and getattr(c, new, None) != val:
            setattr(c, new, val)
            added[new] = val
    return added


FIXTURE_CONFIG_FIXES = {
    "Step37VisionConfig": _fix_step3p7_vision,
    "GlmMoeDsaConfig": _fix_glm5,
    "HYV3Config": _fix_hy_v3,
    "DeepseekV4Config": _fix_deepseek_v4,
}


def _fixture_config_defaults(bridge, info: dict) -> None:
    cfg = bridge.hf_pretrained.config
    added = {}
    for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "vision_config", None)):
        fix = FIXTURE_CONFIG_FIXES.get(type(c).__name__) if c is not None else None
        if fix:
            added.update({f"{type(c).__name__}.{k}": v for k, v in fix(c).items()})
    if added:
        info.setdefault("fixture_config_defaults", {}).update(added)


def do_import(fixture: str, megatron_dir: str, mtp_num_layers: int | None, info: dict) -> None:
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    bridge = AutoBridge.from_hf_pretrained(fixture)
    info["model_bridge"] = type(bridge._model_bridge).__name__
    _fixture_config_defaults(bridge, info)
    provider = bridge.to_megatron_provider(load_weights=True)
    info["provider"] = type(provider).__name__
    info["bridge_mtp_num_layers"] = getattr(provider, "mtp_num_layers", None)
    info["cpu_provider_overrides"] = _cpu_provider_overrides(provider)
    if mtp_num_layers is not None:
        provider.mtp_num_layers = mtp_num_layers
    info["mtp_num_layers"] = getattr(provider, "mtp_num_layers", None)
    with temporary_distributed_context(backend="gloo"):
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        kw = {}
        if hasattr(bridge._model_bridge, "get_hf_tokenizer_kwargs"):
            kw["hf_tokenizer_kwargs"] = bridge._model_bridge.get_hf_tokenizer_kwargs() or {}
        bridge.save_megatron_model(
            model,
            megatron_dir,
            hf_tokenizer_path=fixture if _has_tokenizer(fixture) else None,
            low_memory_save=True,
            **kw,
        )


def do_export(fixture: str, megatron_dir: str, hf_dir: str, info: dict) -> None:
    from megatron.bridge import AutoBridge

    bridge = AutoBridge.from_hf_pretrained(fixture)
    _fixture_config_defaults(bridge, info)
    if not _has_tokenizer(fixture):
        # FIXTURE: save_artifacts() expects a tokenizer; the tiny fixtures ship none.  Public
        # setter: nothing tokenizer-related is written then.
        bridge.hf_pretrained.tokenizer = None
    bridge.export_ckpt(megatron_dir, hf_dir, show_progress=False)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def get(pkg):
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    pkgs = ("torch", "megatron-core", "megatron-bridge", "transformers", "safetensors")
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
    tmp = tempfile.mkdtemp(prefix="mb062_", dir="/tmp")
    _setup_env(tmp)
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
