"""The main model through transformers and the MTP layers built on it: a :class:`Drafter`."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtpcheck.accept.head import (
    HeadLayout,
    MtpChain,
    MtpHead,
    build_head,
    drafter_layouts,
)
from mtpcheck.dtypes import COMPUTE_DTYPES, torch_name
from mtpcheck.errors import InputError, MtpcheckError, raised_by_us
from mtpcheck.families import ChainHidden, analyse
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.hf_safetensors import FORMAT as HF_FORMAT
from mtpcheck.model import (
    Checkpoint,
)
from mtpcheck.torch_threads import configure_torch_threads

DTYPES: dict[str, torch.dtype] = {
    torch_name(c): getattr(torch, torch_name(c)) for c in COMPUTE_DTYPES
}
"""The compute dtypes, by their torch name (``accept --dtype``, a config's ``dtype``)."""


@dataclass(frozen=True)
class Drafter:
    """A loaded main model and its MTP layers, ready to score sequences."""

    model: Any
    chain: MtpChain
    device: torch.device
    prefixes: tuple[str, ...] = ()
    """Where the checkpoint's MTP layers live (all of them, also those not chained)."""
    keep: tuple[Any, ...] = ()
    """What must live as long as the model (the folder accelerate offloads to)."""
    family: str = ""
    """Registry key of the checkpoint's MTP family."""

    @property
    def head(self) -> MtpHead:
        """Depth 1: the MTP layer every family has."""
        return self.chain.heads[0]  # type: ignore[return-value]


def model_directory(ckpt: Checkpoint) -> Path:
    """The folder transformers loads the main model (and tokenizer) from."""
    if ckpt.format != HF_FORMAT:
        raise InputError(
            ckpt.path,
            f"accept runs the main model through transformers and needs a Hugging Face "
            f"safetensors checkpoint, not {ckpt.format} (convert it with "
            "`mtpcheck convert megatron-to-hf`)",
        )
    if ckpt.config_path is None:
        raise InputError(ckpt.path, "no config.json: transformers cannot build the main model")
    return Path(ckpt.config_path).parent


def resolve_device(device: str) -> torch.device:
    """The torch device ``--device`` names; an error for CUDA where torch has none."""
    if device == "cuda" and not torch.cuda.is_available():
        raise MtpcheckError("--device cuda: no CUDA device is available to torch")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, config: Any) -> torch.dtype:
    """``auto``: float32 on CPU, the checkpoint's stored dtype (else bfloat16) on CUDA."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    stored = config.get("dtype") or config.get("torch_dtype")
    return DTYPES.get(str(stored), torch.bfloat16)


def load_main_model(
    directory: Path,
    dtype: torch.dtype,
    device: torch.device,
    device_map: str | dict[str, Any] | None = None,
    offload: Path | None = None,
) -> Any:
    """The main model through its transformers class (MTP tensors are left out by it): the
    causal-LM class, or for a vision-language model without one (Step-3.7) its
    image-text-to-text class, whose language model is the same decoder. With ``device_map``
    accelerate places it (``offload``: the folder for what it puts on disk), else it is moved
    to ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from mtpcheck.accept.hf_quiet import quiet_transformers

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
            auto: Any = AutoModelForCausalLM
            if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
                auto = AutoModelForImageTextToText
            placed = (
                {"device_map": device_map, "offload_folder": str(offload)} if device_map else {}
            )
            model = auto.from_pretrained(
                str(directory), dtype=dtype, local_files_only=True, **placed
            )
    except Exception as e:  # transformers raises many types for a model it cannot build
        if raised_by_us(e):  # a bug of mtpcheck's own, not the library's refusal
            raise
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(directory, f"transformers cannot load the main model: {reason}") from e
    return (model if device_map else model.to(device)).eval()


def load_drafter(
    ckpt: Checkpoint,
    layouts: Sequence[HeadLayout],
    device: torch.device,
    dtype: str = "auto",
    depths: int | None = None,
    device_map: str | dict[str, Any] | None = None,
) -> Drafter:
    """Load the main model through transformers and build its MTP layers (the first
    ``depths`` of them; all by default) on ``device``; ``device_map`` spreads the main model
    over devices (see :mod:`mtpcheck.accept.device_map`)."""
    if depths is not None and depths > len(layouts):
        raise InputError(
            ckpt.path,
            f"--depths {depths}: the checkpoint has {len(layouts)} complete MTP layer(s) to "
            "chain, one a depth in the teacher-forced chain and under the training rule "
            "(--online with vLLM's draft rule, the default, reuses them for deeper drafts, as "
            "vLLM does)",
        )
    configure_torch_threads()  # before the model runs: see mtpcheck.torch_threads
    directory = model_directory(ckpt)
    torch_dtype = resolve_dtype(dtype, device, ckpt.config)
    offload = tempfile.TemporaryDirectory(prefix="mtpcheck-offload-") if device_map else None
    model = load_main_model(
        directory, torch_dtype, device, device_map, Path(offload.name) if offload else None
    )
    used = layouts[: depths or len(layouts)]
    heads = [build_head(model, ckpt, layout, torch_dtype, device) for layout in used]
    prefixes = tuple(layout.prefix for layout in layouts)
    chain = MtpChain(heads, used[0].chain_hidden)
    return Drafter(model, chain, device, prefixes, (offload,) if offload else (), used[0].family)


def open_drafter(
    path: Path,
    device: str = "cpu",
    dtype: str = "auto",
    depths: int | None = None,
    chain: ChainHidden | None = None,
    device_map: str | dict[str, Any] | None = None,
) -> Drafter | str:
    """The drafter of the checkpoint at ``path``, or why it has none."""
    ckpt = open_checkpoint(path)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    layouts = drafter_layouts(ckpt, analysis, chain)
    if isinstance(layouts, str):
        return layouts
    return load_drafter(ckpt, layouts, resolve_device(device), dtype, depths, device_map)
