"""Load a converted GLM-5 checkpoint's DSA indexer into megatron-core's own ``DSAIndexer``.

Run as a script in a subprocess (``python tests/megatron_dsa_check.py HF_DIR MEGATRON_DIR``).
It builds megatron-core's ``DSAIndexer`` for decoder layer 0 and for the MTP layer on CPU,
loads the torch_dist checkpoint into each through the module's own ``sharded_state_dict``
(key names and shapes come from megatron-core, not from mtpcheck) and compares every loaded
tensor with its HF counterpart, bit for bit. Prints one JSON object.

CPU shims, here only: ``torch.cuda.current_device`` answers "cpu" (rotary embedding buffers);
the indexer's three projections are Transformer Engine ``TELinear``
modules with ``parallel_mode="duplicated"`` (replicated) in megatron-core's spec; without TE a
minimal replicated linear with the same parameter stands in. It stores a ``weight`` exactly as
megatron-core's default ``sharded_state_dict`` does for a replicated module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from megatron_fixtures import single_cpu_rank  # a sibling: these run as scripts

HF_NAMES = {
    "linear_wq_b.weight": "wq_b.weight",
    "linear_wk.weight": "wk.weight",
    "k_norm.weight": "k_norm.weight",
    "k_norm.bias": "k_norm.bias",
    "linear_weights_proj.weight": "weights_proj.weight",
}


def _bytes(t: Any) -> bytes:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _indexer(hf_config: dict[str, Any]) -> Any:
    import torch
    from megatron.core.transformer.experimental_attention_variant import dsa
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from mtpcheck.convert.megatron_config import transformer_config_class, transformer_config_kwargs

    class ReplicatedLinear(MegatronModule):
        def __init__(self, input_size: int, output_size: int, *, config: Any, **_: Any) -> None:
            super().__init__(config=config)
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size))

    single_cpu_rank()
    kw = transformer_config_kwargs(hf_config, "glm_moe_dsa")
    kw["transformer_impl"] = "local"
    config = transformer_config_class(kw)(**kw)
    submodules = dsa.DSAIndexerSubmodules(
        linear_wq_b=ReplicatedLinear,
        linear_wk=ReplicatedLinear,
        k_norm=WrappedTorchNorm,
        linear_weights_proj=ReplicatedLinear,
    )
    return dsa.DSAIndexer(config, submodules).to(config.params_dtype)


def main() -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling
    from safetensors.torch import load_file

    hf_dir, megatron_dir = Path(sys.argv[1]), Path(sys.argv[2])
    hf_config = json.loads((hf_dir / "config.json").read_text())
    weights: dict[str, Any] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    module = _indexer(hf_config)
    n = int(hf_config["num_hidden_layers"])
    result: dict[str, Any] = {}
    for meg_prefix, hf_prefix in (
        ("decoder.layers.0.self_attention.", "model.layers.0.self_attn."),
        ("mtp.layers.0.transformer_layer.self_attention.", f"model.layers.{n}.self_attn."),
    ):
        prefix = meg_prefix + "core_attention.indexer."
        sharded = module.sharded_state_dict(prefix=prefix)
        sharded = {k: v for k, v in sharded.items() if "_extra_state" not in k}
        loaded = dist_checkpointing.load(
            sharded, str(megatron_dir), strict=StrictHandling.ASSUME_OK_UNEXPECTED
        )
        for key, tensor in sorted(loaded.items()):
            if not key.startswith(prefix):
                continue  # common.pt entries (args, iteration, ...)
            hf = weights[hf_prefix + "indexer." + HF_NAMES[key.removeprefix(prefix)]]
            result[key] = tensor.shape == hf.shape and _bytes(tensor) == _bytes(hf)
    print(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
