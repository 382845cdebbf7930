"""The built-in converters: HF safetensors <-> Megatron torch_dist, through the mapping."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError
from mtpcheck.mapping import as_hf, as_megatron
from mtpcheck.mapping.views import require_complete
from mtpcheck.model import Checkpoint

WRITER_FAMILY = {"kimi_k2": "deepseek_v3"}
"""Registry families written with another family's megatron-core layout (same architecture)."""

_TORCH_DTYPE = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "BOOL": "bool",
}


def _empty_destination(dst: Path) -> None:
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise InputError(dst, "destination exists and is not empty; refusing to overwrite")


def _torch_tensor(ckpt: Checkpoint, name: str) -> Any:
    import torch

    meta = ckpt.tensors[name]
    buf = bytearray(meta.nbytes)
    pos = 0
    for chunk in ckpt.read_chunks(name, 1 << 24):
        buf[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    dtype = getattr(torch, _TORCH_DTYPE[meta.dtype])
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(meta.shape)


def hf_to_megatron(hf: Checkpoint, dst: Path) -> Path:
    """Write ``hf`` as a Megatron-LM torch_dist checkpoint (``dst/release``); returns its dir."""
    from mtpcheck.convert import megatron_config
    from mtpcheck.convert.torch_dist_writer import write_torch_dist

    view = as_megatron(hf)
    require_complete(view.plan, hf.path)
    family = view.plan.family
    key = WRITER_FAMILY.get(family.key, family.key)
    info = megatron_config.FAMILIES.get(key)
    if info is None or info.spec != "local":
        why = f": {info.note}" if info else ""
        raise InputError(hf.path, f"the built-in converter cannot write {family.display} yet{why}")
    _empty_destination(dst)
    tensors = {name: _torch_tensor(view, name) for name in view.tensors}
    kwargs = megatron_config.transformer_config_kwargs(hf.config, key)
    args = megatron_config.args_namespace(hf.config, key)
    return write_torch_dist(dst, tensors, kwargs, args, "release")


def megatron_to_hf(
    megatron: Checkpoint, dst: Path, hf_config: Mapping[str, Any], with_copies: bool = True
) -> list[Path]:
    """Write ``megatron`` as HF sharded safetensors + index + config.json under ``dst``."""
    from mtpcheck.convert.hf_writer import write_hf

    view = as_hf(megatron, hf_config, with_copies)
    if view.plan.unmapped:
        shown = ", ".join(view.plan.unmapped[:5])
        raise InputError(
            megatron.path,
            f"{len(view.plan.unmapped)} tensor(s) have no HF counterpart: {shown}",
        )
    _empty_destination(dst)
    return write_hf(view, dst, config=view.config)
