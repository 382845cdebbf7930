#!/usr/bin/env python3
"""Run mbridge 0.15.1 HF <-> Megatron (torch_dist) conversion on a CPU-only machine.

    python mbridge_convert.py import HF_DIR MEGATRON_DIR [--compat]
    python mbridge_convert.py export MEGATRON_DIR HF_DIR --hf-config HF_DIR_ORIG [--compat]

The conversion is mbridge's own code path; this script only supplies what a training job would:
  import: AutoBridge.from_config(hf_config).get_model() -> bridge.load_weights(model, HF_DIR)
          -> megatron.core.dist_checkpointing.save(model.sharded_state_dict(), MEGATRON_DIR)
  export: AutoBridge.from_config(hf_config).get_model()
          -> dist_checkpointing.load(model.sharded_state_dict(), MEGATRON_DIR)
          -> model.load_state_dict(...) -> bridge.save_weights(model, HF_DIR)

Every patch below marked CPU-SHIM exists only because this machine has no CUDA and no
Transformer Engine (TE), or runs transformers 5; none changes a tensor value or a checkpoint
key. They are monkeypatches in this process only; nothing installed is edited. ``--compat``
adds fixes for mbridge bugs that break a family on any machine (see ``install_compat_fixes``).
Only the families the test suite converts are covered: GLM-4.5 (stock) and MiMo (--compat).

On success the only output is one line on stderr. Library output is captured (file descriptors
1 and 2) and shown only on failure. Nothing is written outside the destination except a private
temporary directory (TMPDIR for the libraries), removed on exit.

Tested with: torch 2.13.0+cpu, megatron-core 0.16.1, mbridge 0.15.1 (--no-deps),
transformers 5.24.0, psutil 7.2.2 (megatron-core's torch_dist save hangs without it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

SHIMS: list[str] = []  # what was patched, listed by --verbose


def _shim(text: str) -> None:
    SHIMS.append(text)


# ---------------------------------------------------------------------------------------------
# Process setup
# ---------------------------------------------------------------------------------------------


def quiet_libraries() -> None:
    """Silence library chatter that would otherwise reach the captured output anyway."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


def init_cpu_distributed() -> None:
    """A one-process gloo group and Megatron's parallel state (TP = PP = 1)."""
    import torch

    # CPU-SHIM 1: mbridge and megatron-core ask torch.cuda.current_device() only for the device
    # to create tensors on; "cpu" is a valid answer for every such call.
    torch.cuda.current_device = lambda: "cpu"
    _shim("torch.cuda.current_device -> 'cpu'")
    # CPU-SHIM 2: megatron-core 0.16.1's MoEAlltoAllTokenDispatcher and SharedExpertMLP create a
    # torch.cuda.Stream in __init__; a stream is only used in forward(), which never runs here.
    torch.cuda.Stream = _InertStream  # type: ignore[misc,assignment]
    _shim("torch.cuda.Stream -> inert placeholder (constructed, never used)")
    # CPU-SHIM 3: dist_checkpointing's torch_dist writer calls torch.cuda.synchronize() after
    # copying tensors; CPU copies are synchronous already, so a no-op is exact.
    torch.cuda.synchronize = lambda *a, **k: None
    _shim("torch.cuda.synchronize -> no-op")

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


class _InertStream:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Local (non-TE) layer specs that save and name weights like the TE specs mbridge expects
# ---------------------------------------------------------------------------------------------

# TE's grouped experts name expert i's weight experts.linear_fcN.weight<i>; the local
# SequentialMLP names it experts.local_experts.<i>.linear_fcN.weight (same sharded key).
_LOCAL_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$")


def _te_keys_map(layer_spec: Any) -> dict[str, str]:
    """Local-module prefix -> TE-module prefix for one (non-MLA) transformer layer.

    With TE, the input norm is fused into self_attention.linear_qkv (layer_norm_weight) and, in
    a dense layer, the pre-MLP norm into mlp.linear_fc1; an MoE layer keeps pre_mlp_layernorm.
    megatron-core's local spec maps pre_mlp_layernorm for MoE layers too, so build the map here.
    """
    from megatron.core.transformer.moe.moe_layer import MoELayer

    keys = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_"}
    if getattr(layer_spec.submodules.mlp, "module", None) is not MoELayer:
        keys["pre_mlp_layernorm."] = "mlp.linear_fc1.layer_norm_"
    return keys


def install_local_specs(bridge: Any) -> None:
    """Build the model from megatron-core's local (torch) modules instead of TE ones."""
    import mbridge.models.mimo as mimo_module
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.transformer_layer import TransformerLayer

    # CPU-SHIM 4: mbridge hard-codes use_transformer_engine=True; TE needs CUDA. The local spec
    # gets a sharded_state_dict_keys_map so that dist_checkpointing keys equal the TE layout's.
    def layer_spec(vp_stage: int | None = None) -> Any:
        bridge.has_vp_stage = True  # what mbridge's own method records (mcore >= 0.13 API)
        spec = gpt_layer_specs.get_gpt_decoder_block_spec(
            bridge.config,
            use_transformer_engine=False,
            normalization=bridge.config.normalization,
            vp_stage=vp_stage,
        )
        for each in {id(s): s for s in spec.layer_specs}.values():
            each.submodules.sharded_state_dict_keys_map = _te_keys_map(each)
        return spec

    bridge._get_transformer_layer_spec = layer_spec
    _shim("bridge._get_transformer_layer_spec -> local decoder spec with TE-layout sharded keys")

    # CPU-SHIM 5: the same for MiMo's MTP block, which mbridge builds with TE modules.
    build_mtp_spec = gpt_layer_specs.get_gpt_mtp_block_spec

    def mtp_spec(config: Any, spec: Any, use_transformer_engine: bool = True, **kw: Any) -> Any:
        return build_mtp_spec(config, spec, use_transformer_engine=False, **kw)

    mimo_module.get_gpt_mtp_block_spec = mtp_spec
    _shim("mbridge.models.mimo.get_gpt_mtp_block_spec -> use_transformer_engine=False")

    # CPU-SHIM 6: mbridge's HF <-> Megatron name tables use TE module names. Its one function
    # giving a model parameter's "global" name (used by load_weights and by export_weights)
    # is wrapped to rename local-module names to the TE names, by the same maps as CPU-SHIM 4.
    to_global: Callable[..., dict[str, str]] = bridge._weight_name_mapping_mcore_local_to_global

    def te_global_names(model: Any, consider_ep: bool = True) -> dict[str, str]:
        from mbridge.core.util import unwrap_model

        layer_maps = {
            f"{name}.": module.submodules_config.sharded_state_dict_keys_map
            for name, module in unwrap_model(model).named_modules()
            if isinstance(module, TransformerLayer)
        }
        return {
            local: _rename(local, glob, layer_maps)
            for local, glob in to_global(model, consider_ep).items()
        }

    bridge._weight_name_mapping_mcore_local_to_global = te_global_names
    _shim("bridge._weight_name_mapping_mcore_local_to_global -> TE module names")


def _rename(local: str, glob: str, layer_maps: dict[str, dict[str, str]]) -> str:
    """``glob`` (the global name of parameter ``local``) with TE instead of local names."""
    for prefix, keys_map in layer_maps.items():
        if not local.startswith(prefix):
            continue
        rest = local[len(prefix) :]  # the same tail ends glob: only the layer number differs
        for old, new in keys_map.items():
            if rest.startswith(old):
                glob = glob[: len(glob) - len(rest)] + new + rest[len(old) :]
                break
        break
    return _LOCAL_EXPERT.sub(r"mlp.experts.\2.\3\1", glob)


# ---------------------------------------------------------------------------------------------
# --compat: mbridge bugs, not CPU matters
# ---------------------------------------------------------------------------------------------


def install_compat_fixes() -> None:
    """MimoBridge._get_gptmodel_args (0.15.1) passes the TransformerConfig where
    get_gpt_mtp_block_spec wants a layer spec, so every MiMo model build fails with
    ValueError('Invalid spec'). Pass the decoder block spec, as DeepseekV3Bridge does."""
    import mbridge.models.mimo as mimo_module

    parent = mimo_module.Qwen2Bridge._get_gptmodel_args

    def gptmodel_args(self: Any) -> dict[str, Any]:
        args = parent(self)
        if self.config.mtp_num_layers is not None:
            args["mtp_block_spec"] = mimo_module.get_gpt_mtp_block_spec(
                self.config, self._get_transformer_layer_spec(), use_transformer_engine=True
            )
        return args

    mimo_module.MimoBridge._get_gptmodel_args = gptmodel_args
    _shim("--compat: MimoBridge builds its MTP block from the decoder layer spec")


# ---------------------------------------------------------------------------------------------
# Bridge and model
# ---------------------------------------------------------------------------------------------


def make_bridge(hf_dir: str, compat: bool) -> tuple[Any, list[str]]:
    """The bridge for ``hf_dir``'s config, and the config attributes added for mbridge."""
    from mbridge import AutoBridge
    from transformers import AutoConfig, Qwen2Config

    if compat:
        install_compat_fixes()

    # CPU-SHIM 7 (no remote code): MiMo's config class (MiMoConfig, a Qwen2Config with
    # model_type "mimo") comes with trust_remote_code; the fixture ships no code.
    class MiMoConfig(Qwen2Config):
        model_type = "mimo"

    try:
        AutoConfig.register("mimo", MiMoConfig)
    except ValueError:  # already registered (a newer transformers knows it)
        pass
    hf_config = AutoConfig.from_pretrained(hf_dir)

    # CPU-SHIM 8 (transformers 5): rope_theta and partial_rotary_factor moved into
    # rope_parameters; mbridge 0.15.1 reads them as attributes. They are added for building the
    # model and removed again before mbridge writes config.json (see drop_added).
    added = []
    for name, value in (getattr(hf_config, "rope_parameters", None) or {}).items():
        if name in ("rope_theta", "partial_rotary_factor") and not hasattr(hf_config, name):
            setattr(hf_config, name, value)
            added.append(name)
    if added:
        _shim(f"hf_config.{{{','.join(added)}}} copied from rope_parameters")

    bridge = AutoBridge.from_config(hf_config)
    # CPU-SHIM 9: parameters are created on the CPU; grouped-GEMM experts need the CUDA
    # grouped_gemm package, so use SequentialMLP (same sharded keys, see CPU-SHIM 6); the
    # persistent fused layer norm is apex/TE-only and the torch norm asserts it is off.
    extra: dict[str, Any] = {"use_cpu_initialization": True}
    if getattr(bridge.config, "moe_grouped_gemm", False):
        extra["moe_grouped_gemm"] = False
    if getattr(bridge.config, "persist_layer_norm", False):
        extra["persist_layer_norm"] = False
    bridge.set_extra_args(**extra)
    _shim(f"bridge.set_extra_args({extra})")
    install_local_specs(bridge)
    return bridge, added


def build_model(bridge: Any) -> list[Any]:
    # use_cpu_initialization with use_torch_fsdp2 (and wrap_with_ddp=False, so no FSDP wrapper)
    # is the one combination in mbridge.core.util.get_model that skips model.cuda().
    return bridge.get_model(wrap_with_ddp=False, use_cpu_initialization=True, use_torch_fsdp2=True)


def require_empty(path: str) -> None:
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
        raise SystemExit(f"destination exists and is not an empty directory: {path}")


def do_import(hf_dir: str, megatron_dir: str, compat: bool) -> None:
    from megatron.core import dist_checkpointing

    require_empty(megatron_dir)
    bridge, _ = make_bridge(hf_dir, compat)
    model = build_model(bridge)
    bridge.load_weights(model, hf_dir)
    os.makedirs(megatron_dir, exist_ok=True)
    dist_checkpointing.save(model[0].sharded_state_dict(), megatron_dir)


def do_export(megatron_dir: str, hf_dir: str, hf_config_dir: str, compat: bool) -> None:
    from mbridge.core.util import unwrap_model
    from megatron.core import dist_checkpointing

    require_empty(hf_dir)
    bridge, added = make_bridge(hf_config_dir, compat)
    model = build_model(bridge)
    state = dist_checkpointing.load(model[0].sharded_state_dict(), megatron_dir)
    # the inner GPTModel: the Float16Module wrapper's load_state_dict returns nothing
    missing, unexpected = unwrap_model(model[0]).load_state_dict(state, strict=False)
    missing = [k for k in missing if "_extra_state" not in k]
    if missing or unexpected:
        raise SystemExit(
            f"checkpoint does not fit the model: missing {missing}, extra {unexpected}"
        )
    # save_weights reads bridge.safetensor_io (the original shard layout), which mbridge only
    # sets in load_weights; set it the same way, from the original HF directory.
    bridge.safetensor_io = bridge._get_safetensor_io(hf_config_dir)
    for name in added:
        delattr(bridge.hf_config, name)
    bridge.save_weights(model, hf_dir)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["import", "export"])
    ap.add_argument("src", help="HF directory (import) or Megatron directory (export)")
    ap.add_argument("dst", help="new or empty output directory")
    ap.add_argument("--hf-config", help="export: the original HF directory (config, shards)")
    ap.add_argument("--compat", action="store_true", help="fix mbridge 0.15.1's MiMo MTP spec")
    ap.add_argument("-v", "--verbose", action="store_true", help="show library output, shims")
    args = ap.parse_args(argv)
    if args.mode == "export" and not args.hf_config:
        ap.error("export needs --hf-config HF_DIR_ORIG")
    return args


def convert(args: argparse.Namespace) -> None:
    init_cpu_distributed()
    if args.mode == "import":
        do_import(args.src, args.dst, args.compat)
    else:
        do_export(args.src, args.dst, args.hf_config, args.compat)


class CapturedOutput:
    """Send file descriptors 1 and 2 (Python and C++ output alike) to a file while active."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.saved: list[int] = []

    def __enter__(self) -> CapturedOutput:
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = [os.dup(1), os.dup(2)]
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), self.saved, strict=True):
            os.dup2(fd, target)
            os.close(fd)

    def text(self) -> str:
        try:
            with open(self.path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="mbridge-convert-")
    # libraries (torch inductor, for one) create folders under TMPDIR at import time
    os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch
    if not args.verbose:
        quiet_libraries()
    capture = CapturedOutput(os.path.join(scratch, "output.log"))
    error = ""
    try:
        if args.verbose:
            convert(args)
        else:
            with capture:
                convert(args)
    except SystemExit as e:  # our own refusals (and argparse inside libraries)
        error = str(e.code) if not isinstance(e.code, int) else f"exit status {e.code}"
    except BaseException as e:
        error = "".join(traceback.format_exception(e)).rstrip()
    finally:
        _destroy_process_group()
        try:
            library_output = "" if args.verbose else capture.text()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.verbose:
        for text in SHIMS:
            print(f"shim: {text}", file=sys.stderr)
    seconds = time.monotonic() - started
    if error:
        if library_output.strip():
            sys.stderr.write(library_output.rstrip() + "\n")
        print(f"mbridge {args.mode} FAILED: {args.src} -> {args.dst}", file=sys.stderr)
        print(error, file=sys.stderr)  # last, so that a tail of stderr shows it
        return 1
    print(f"mbridge {args.mode}: {args.src} -> {args.dst} ({seconds:.1f} s)", file=sys.stderr)
    return 0


def _destroy_process_group() -> None:
    if "torch" not in sys.modules:
        return
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
