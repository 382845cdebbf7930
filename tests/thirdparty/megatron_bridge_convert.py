#!/usr/bin/env python3
"""Run Megatron-Bridge 0.3.1 HF <-> Megatron (torch_dist) conversion on a CPU-only machine.

    python bridge_convert.py import HF_DIR MEGATRON_DIR
    python bridge_convert.py export MEGATRON_DIR HF_DIR [--hf-reference HF_DIR_ORIG]

Conversion itself is Megatron-Bridge's public API:
  import: AutoBridge.from_hf_pretrained -> to_megatron_provider -> provide_distributed_model
          -> AutoBridge.save_megatron_model (what AutoBridge.import_ckpt does, split up so that the
          provider can be given the CPU settings below before the model is built)
  export: AutoBridge.from_hf_pretrained(reference).export_ckpt(MEGATRON_DIR, HF_DIR)

Everything below marked CPU-SHIM exists only because this machine has no CUDA and no
Transformer Engine (TE).  Nothing inside the installed packages is edited; all shims are
monkeypatches applied in this process only.  Tested with: torch 2.13.0+cpu, megatron-core 0.16.1,
megatron-bridge 0.3.1 (--no-deps), transformers 5.24.0, nvidia-modelopt 0.47.0 (--no-deps).
"""

import argparse
import builtins
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import types

# ---------------------------------------------------------------------------------------------
# CPU-SHIM 1: import-time stubs, scoped to the single importing module that needs them.
# Every other module still sees these packages as absent (so mcore/bridge keep HAVE_TE=False
# and pick their non-TE code paths).  None of the stubbed objects is ever called during
# conversion; they only satisfy module-level `import`/decorators/annotations.
#   transformer_engine      <- megatron.bridge.peft.lora_layers / lora (unconditional
#                              `import transformer_engine.pytorch as te`; LoRA classes only)
#   triton                  <- megatron.core.inference.contexts.attention_context.triton.*
#                              (@triton.jit kernels for inference; avoids a ~1 GB triton install)
#   datasets                <- megatron.bridge.data.* (SFT datasets; avoids pyarrow/pandas)
#   torch.utils.tensorboard <- megatron.bridge.training.state (SummaryWriter for training logs;
#                              avoids the tensorboard package)
# ---------------------------------------------------------------------------------------------
_real_import = builtins.__import__


class _Stubbed:
    def __init__(self, *a, **k):
        raise RuntimeError("stubbed out by bridge_convert.py (CPU-only harness)")


def _stub_module(name):
    mod = types.ModuleType(name)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        val = (
            _stub_module(f"{name}.{attr}")
            if attr in ("pytorch", "ops", "language", "writer")
            else type(attr, (_Stubbed,), {})
        )
        setattr(mod, attr, val)
        return val

    mod.__getattr__ = __getattr__
    return mod


_triton = _stub_module("triton")
_triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
_STUBS = {  # stubbed name -> (stub module, importer-__name__ prefix it is served to)
    "transformer_engine": (_stub_module("transformer_engine"), "megatron.bridge.peft."),
    "triton": (_triton, "megatron.core.inference.contexts.attention_context.triton."),
    "datasets": (_stub_module("datasets"), "megatron.bridge.data."),
    "torch.utils.tensorboard": (
        _stub_module("torch.utils.tensorboard"),
        "megatron.bridge.training.state",
    ),
}


def _scoped_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        for key, (stub, prefix) in _STUBS.items():
            if name == key or name.startswith(key + "."):
                if not (globals or {}).get("__name__", "").startswith(prefix):
                    break
                if "." in key and not fromlist:
                    break
                mod = stub
                if fromlist:
                    for part in name[len(key) :].split(".")[1:]:
                        mod = getattr(mod, part)
                return mod
    return _real_import(name, globals, locals, fromlist, level)


builtins.__import__ = _scoped_import


def _setup_env(tmp):
    # keep every cache/temp write under /tmp; no network
    os.environ.setdefault("HF_HOME", os.path.join(tmp, "hf_home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tmp, "triton"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tmp, "inductor"))
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(tmp, "mpl"))
    os.environ.setdefault("TMPDIR", tmp)
    os.environ.setdefault("WANDB_MODE", "disabled")
    # temporary_distributed_context(): gloo, single process, loopback only
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _install_runtime_shims():
    import re

    import torch

    # CPU-SHIM 2: torch.cuda bits touched while *building* the model / state dict.
    #  - MoE router (expert_bias, local_tokens_per_expert), experts and MTP allocate buffers with
    #    device=torch.cuda.current_device(); on CPU that must be the CPU device.
    #  - save_megatron_model() collects get_rng_state() (incl. torch.cuda.get_rng_state()) but
    #    does not write it (CheckpointConfig(save_rng=False)), so an empty tensor is fine.
    #  - mcore's torch_dist writer (filesystem_async.preload_tensors) calls
    #    torch.cuda.synchronize(); nothing to wait for on CPU -> no-op.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.get_rng_state = lambda device="cuda": torch.empty(0, dtype=torch.uint8)

    # CPU-SHIM 3: megatron.bridge.models.gpt_provider.mtp_block_spec() hard-codes
    # get_gpt_mtp_block_spec(..., use_transformer_engine=True) -> NameError TESpecProvider
    # without TE. Force the local (non-TE) MTP spec; the decoder already uses the local spec
    # (HAVE_TE=False).
    import megatron.core.models.gpt.gpt_layer_specs as gls

    orig_mtp = gls.get_gpt_mtp_block_spec

    def mtp_spec_local(config, spec, use_transformer_engine, vp_stage=None, pp_rank=None):
        return orig_mtp(
            config, spec, use_transformer_engine=False, vp_stage=vp_stage, pp_rank=pp_rank
        )

    gls.get_gpt_mtp_block_spec = mtp_spec_local

    # CPU-SHIM 3b: MLA (DeepSeek-V3) passes k_channels/v_channels to its core_attention, which only
    # TE's DotProductAttention accepts; mcore's local DotProductAttention raises TypeError.  The
    # local class has no parameters and forward() is never run here, so just drop the two kwargs.
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    orig_dpa_init = DotProductAttention.__init__

    def dpa_init(self, *a, k_channels=None, v_channels=None, **k):
        orig_dpa_init(self, *a, **k)

    DotProductAttention.__init__ = dpa_init

    # CPU-SHIM 3c: megatron.core.transformer.multi_latent_attention decides HAVE_TE by importing
    # megatron.core.extensions.transformer_engine, which (0.16.1) succeeds without TE because it
    # substitutes a MagicMock for `te`; so HAVE_TE=True and `isinstance(linear_proj, TELinear)`
    # raises "isinstance() arg 2 must be a type".  TE is absent: correct the flag.
    import megatron.core.transformer.multi_latent_attention as mla

    mla.HAVE_TE = False

    # CPU-SHIM 4: without TE/grouped_gemm the experts are mcore SequentialMLP, whose parameters are
    # named `...experts.local_experts.{i}.linear_fc{1,2}.weight` instead of TEGroupedMLP's
    # `...experts.linear_fc{1,2}.weight{i}`.  The GLM-4.5 / DeepSeek bridges only register the
    # TEGroupedMLP names, so retry the bridge's own mapping lookup under the TEGroupedMLP name.
    # (The torch_dist checkpoint itself is unaffected: mcore writes the same sharded keys
    # `...mlp.experts.experts.linear_fc1.weight` for SequentialMLP and TEGroupedMLP.)
    from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry

    orig_lookup = MegatronMappingRegistry.megatron_to_hf_lookup
    local_expert = re.compile(r"\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$")

    def lookup(self, name):
        mapping = orig_lookup(self, name)
        if mapping is None and local_expert.search(name):
            # the resolved mapping keeps the TEGroupedMLP name: gather_from_ep_ranks() parses the
            # expert number from its trailing `weight{i}`
            mapping = orig_lookup(self, local_expert.sub(r".experts.\2.\3\1", name))
        return mapping

    MegatronMappingRegistry.megatron_to_hf_lookup = lookup

    # Export path: the provider is rebuilt from run_config.yaml; apply the same CPU overrides so
    # checkpoints written with TE/GPU settings can also be loaded here.
    import megatron.bridge.training.model_load_save as mls

    orig_load_model_config = mls.load_model_config

    def load_model_config(*a, **k):
        cfg, mlm_args = orig_load_model_config(*a, **k)
        _cpu_provider_overrides(cfg)
        return cfg, mlm_args

    mls.load_model_config = load_model_config


def _cpu_provider_overrides(p):
    """CPU-SHIM 5: model-construction settings only; no effect on tensor values or keys.

    Each one otherwise fails without CUDA or TE:

    * moe_permute_fusion: TransformerConfig says 'fused permutation is not available';
    * persist_layer_norm: WrappedTorchNorm does not support it;
    * moe_token_dispatcher_type: the alltoall dispatcher creates a torch.cuda.Stream;
    * moe_shared_expert_overlap: only valid with the alltoall dispatcher;
    * moe_grouped_gemm: the legacy GroupedMLP needs the CUDA ``grouped_gemm`` package;
    * gradient_accumulation_fusion: needs APEX (the DeepSeek-V3 bridge turns it on);
    * transformer_layer_spec (export only): a TE spec saved by a GPU run becomes the local one.
    """
    from functools import partial

    p.moe_permute_fusion = False
    p.persist_layer_norm = False
    p.moe_token_dispatcher_type = "allgather"
    p.moe_shared_expert_overlap = False
    p.moe_grouped_gemm = False
    p.gradient_accumulation_fusion = False
    spec = getattr(p, "transformer_layer_spec", None)
    if isinstance(spec, partial) and spec.keywords.get("use_transformer_engine"):
        p.transformer_layer_spec = partial(
            spec.func, *spec.args, **{**spec.keywords, "use_transformer_engine": False}
        )


def _has_tokenizer(hf_dir):
    return any(
        os.path.exists(os.path.join(hf_dir, f))
        for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


def do_import(hf_dir, megatron_dir):
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    bridge = AutoBridge.from_hf_pretrained(hf_dir)
    provider = bridge.to_megatron_provider(load_weights=True)
    _cpu_provider_overrides(provider)
    hf_cfg = bridge.hf_pretrained.config
    if (
        getattr(hf_cfg, "model_type", "") == "deepseek_v3"
        and getattr(hf_cfg, "scoring_func", None) is None
    ):
        # FIXTURE-SHIM: transformers' own DeepseekV3Config does not serialize `scoring_func`
        # (hub DeepSeek-V3 configs carry "scoring_func": "sigmoid"; HF's DeepseekV3 always uses
        # sigmoid).  The bridge maps scoring_func -> moe_router_score_function only when present,
        # otherwise mcore's default "softmax" + expert bias fails TransformerConfig validation
        # ("Expert bias for aux-loss-free routing only supports sigmoid score function").
        provider.moe_router_score_function = "sigmoid"
    with temporary_distributed_context(backend="gloo"):
        provider.finalize()
        model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
        kw = {}
        if hasattr(bridge._model_bridge, "get_hf_tokenizer_kwargs"):
            kw["hf_tokenizer_kwargs"] = bridge._model_bridge.get_hf_tokenizer_kwargs()
        # as import_ckpt(), but with the tokenizer only if the HF dir ships one (fixtures don't)
        bridge.save_megatron_model(
            model,
            megatron_dir,
            hf_tokenizer_path=hf_dir if _has_tokenizer(hf_dir) else None,
            low_memory_save=True,
            **kw,
        )


def do_export(megatron_dir, hf_dir, hf_reference):
    from megatron.bridge import AutoBridge

    if hf_reference is None:
        hf_reference = AutoBridge.get_hf_model_id_from_checkpoint(megatron_dir)
        if hf_reference is None:
            raise SystemExit("export: no --hf-reference given and none recorded in the checkpoint")
    bridge = AutoBridge.from_hf_pretrained(hf_reference)
    if os.path.isdir(hf_reference) and not _has_tokenizer(hf_reference):
        # FIXTURE-SHIM: save_artifacts() treats the tokenizer as required; the tiny fixtures ship
        # none, so set it to None via the public setter (then nothing tokenizer-related is written).
        bridge.hf_pretrained.tokenizer = None
    bridge.export_ckpt(megatron_dir, hf_dir, show_progress=False)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("direction", choices=["import", "export"])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument(
        "--hf-reference", default=None, help="export: original HF dir (config/artifacts)"
    )
    ap.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="let library output through (else it goes to a log shown only on failure)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=float(os.environ.get("BRIDGE_CONVERT_TIMEOUT", 600)),
        help="abort (exit 3) after this many seconds; guards against a hung checkpoint writer",
    )
    args = ap.parse_args(argv)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="bridge_convert_", dir="/tmp")
    _setup_env(tmp)
    log_path = os.path.join(tmp, "bridge.log")
    saved_out, saved_err = os.dup(1), os.dup(2)

    def restore_and_report(code, msg):
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        if code != 0 and not args.verbose:
            with open(log_path, errors="replace") as f:
                tail = f.readlines()[-60:]
            os.write(2, ("".join(tail)).encode())
        os.write(2, (msg + "\n").encode())
        shutil.rmtree(tmp, ignore_errors=True)

    if not args.verbose:  # fd-level, so the writer's child processes are covered too
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def on_timeout():
        restore_and_report(3, f"bridge_convert {args.direction}: TIMEOUT after {args.timeout:.0f}s")
        os._exit(3)

    watchdog = threading.Timer(args.timeout, on_timeout)
    watchdog.daemon = True
    watchdog.start()
    try:
        _install_runtime_shims()
        if args.direction == "import":
            do_import(os.path.abspath(args.src), os.path.abspath(args.dst))
        else:
            ref = os.path.abspath(args.hf_reference) if args.hf_reference else None
            do_export(os.path.abspath(args.src), os.path.abspath(args.dst), ref)
    except BaseException as e:  # noqa: B036
        watchdog.cancel()
        traceback.print_exc()
        restore_and_report(
            1, f"bridge_convert {args.direction}: FAILED ({type(e).__name__}: {e})"[:2000]
        )
        return 1
    watchdog.cancel()
    restore_and_report(0, f"bridge_convert {args.direction}: ok in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":  # required: mcore's torch_dist writer spawns a multiprocessing Manager
    sys.exit(main())
