"""Tiny megatron-core GPT models on CPU (local spec, MTP included) and a strict checkpoint load.

``build_gpt_model`` constructs a model from an HF config with ``mtpcheck.convert.
megatron_config`` and fills every floating-point tensor of its state_dict from ``seed`` (norms
and the router's expert bias included), so two seeds differ in every tensor. Construction needs
``torch.cuda.current_device`` to name the CPU (the MoE router allocates its expert-bias buffer
there, MLA's rotary embedding too); MLA additionally needs two stand-ins, see ``_mla_patches``.
Both are applied only while the model is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.validation import StrictHandling
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer import multi_latent_attention

from mtpcheck.convert import megatron_config


class CoreAttentionStandIn(torch.nn.Module):
    """Parameter-free placeholder for MLA's core attention (never run: no forward here).

    megatron-core 0.16.1's local ``DotProductAttention`` rejects the ``k_channels`` argument
    MLA passes; the core attention holds no tensors, so names and shapes are unaffected.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


@contextlib.contextmanager
def _cpu_current_device() -> Iterator[None]:
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
        yield


@contextlib.contextmanager
def _mla_patches() -> Iterator[None]:
    # Without Transformer Engine, megatron's TE stubs are mocks and MLA's
    # ``isinstance(self.linear_proj, TELinear)`` raises; HAVE_TE=False skips that branch.
    with mock.patch.object(multi_latent_attention, "HAVE_TE", False):
        yield


def sharded_metadata() -> dict[str, Any]:
    """The ``metadata`` Megatron-LM passes to ``sharded_state_dict`` (single rank)."""
    return {
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "distrib_optim_sharding_type": "dp_reshardable",
    }


def _fill_from_seed(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=gen, dtype=torch.float32)
                tensor.copy_(noise.to(tensor.dtype))


def build_gpt_model(
    hf_config: Mapping[str, Any],
    family_key: str,
    seed: int,
    fill: bool = True,
    **config_overrides: Any,
) -> GPTModel:
    """A tiny CPU ``GPTModel`` (local spec, MTP block) of ``family_key``, filled from ``seed``
    (``fill=False``: as megatron-core's own initialisation left it, seeded by ``seed``).

    Needs an initialised process group and model-parallel state (TP = PP = 1).
    """
    kwargs = {**megatron_config.transformer_config_kwargs(hf_config, family_key)}
    kwargs.update(config_overrides)
    if kwargs.get("transformer_impl", "local") != "local":
        raise ValueError(f"{family_key} needs Transformer Engine; it has no local spec")
    config = megatron_config.transformer_config_class(kwargs)(**kwargs)
    torch.manual_seed(seed)
    mla = bool(kwargs.get("multi_latent_attention"))
    with _cpu_current_device(), _mla_patches() if mla else contextlib.nullcontext():
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=config.normalization
        )
        if mla:
            for layer_spec in spec.layer_specs:
                layer_spec.submodules.self_attention.submodules.core_attention = (
                    CoreAttentionStandIn
                )
        mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
        model = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            mtp_block_spec=mtp_spec,
            **megatron_config.gpt_model_kwargs(hf_config, family_key),
        )
    if fill:
        _fill_from_seed(model, seed)
    return model


def canonical_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's canonical tensors: its state_dict without ``_extra_state`` entries."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def strict_load(model: GPTModel, ckpt_dir: str | Path) -> None:
    """Load a torch_dist checkpoint into ``model`` the strict way, raising on any mismatch.

    ``dist_checkpointing.load`` with ``StrictHandling.RAISE_ALL`` (missing *and* unexpected
    keys raise), then ``load_state_dict(strict=True)``.
    """
    sharded = {"model": model.sharded_state_dict(metadata=sharded_metadata())}
    loaded = dist_checkpointing.load(sharded, str(ckpt_dir), strict=StrictHandling.RAISE_ALL)
    model.load_state_dict(loaded["model"], strict=True)
