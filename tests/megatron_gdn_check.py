"""Load a converted Qwen3-Next checkpoint's gated delta net into megatron-core's own module.

Run as a script in a subprocess (``python tests/megatron_gdn_check.py HF_DIR MEGATRON_DIR``) so
megatron-core and torch.distributed never load into the pytest process. It builds
megatron-core's ``GatedDeltaNet`` for decoder layer 0 on CPU, loads the torch_dist checkpoint
into it through the module's own ``sharded_state_dict`` (which names the split
``in_proj.weight.query`` ... keys and merges them back), and compares what megatron-core's
forward would take out of ``in_proj`` and ``conv1d`` with what transformers' own
``Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`` takes out of the HF weights, bit for
bit. Prints one JSON object: per compared part, whether the bytes are identical.

CPU shims, here only: megatron-core refuses to build the module without the ``fla`` kernels
(used by forward alone, which never runs here) and allocates on ``torch.cuda.current_device()``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from megatron_fixtures import single_cpu_rank  # a sibling: these run as scripts

PREFIX = "decoder.layers.0.self_attention."


def _bytes(t: Any) -> bytes:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _megatron_module(hf_config: dict[str, Any]) -> Any:
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm import gated_delta_net
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mtpcheck.convert.megatron_config import transformer_config_kwargs

    single_cpu_rank()
    # megatron-core 0.16 defines the flag in the module, >= 0.17 in gated_delta_net/common.py
    for module in (gated_delta_net, sys.modules.get(gated_delta_net.__name__ + ".common")):
        if module is not None:
            module.HAVE_FLA = True
    kw = transformer_config_kwargs(hf_config, "qwen3_next")
    kw["transformer_impl"] = "local"
    # torch's norm has no zero-centred gamma; it changes forward only (checked on the stored
    # value below), not what the module holds
    kw["layernorm_zero_centered_gamma"] = False
    kw["perform_initialization"] = False  # values come from the checkpoint
    kw["deterministic_mode"] = True  # megatron-core >= 0.17 then picks its torch kernel
    kw = {k: v for k, v in kw.items() if not k.startswith("moe_") and k != "num_moe_experts"}
    config = TransformerConfig(**kw)
    submodules = gated_delta_net.GatedDeltaNetSubmodules(
        in_proj=ColumnParallelLinear, out_norm=WrappedTorchNorm, out_proj=RowParallelLinear
    )
    module = gated_delta_net.GatedDeltaNet(
        config,
        submodules,
        layer_number=1,
        pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
    )
    return module.to(config.params_dtype)  # torch's norm is built in float32


def _hf_parts(hf_dir: Path, hf_config: dict[str, Any]) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    weights: dict[str, Any] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    layer = Qwen3NextGatedDeltaNet(Qwen3NextConfig(**hf_config), layer_idx=0)
    p = "model.layers.0.linear_attn."
    # outputs of the projections for the identity input: row j of W is output feature j
    qkvz = weights[p + "in_proj_qkvz.weight"].T.unsqueeze(0)
    ba = weights[p + "in_proj_ba.weight"].T.unsqueeze(0)
    with torch.no_grad():
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(qkvz, ba)
    parts = dict(
        zip(("query", "key", "value", "z", "beta", "alpha"), (q, k, v, z, b, a), strict=True)
    )
    parts = {name: t[0] for name, t in parts.items()}  # [hidden, heads(, dim)]
    parts["conv1d"] = weights[p + "conv1d.weight"]
    for hf, meg in (("A_log", "A_log"), ("dt_bias", "dt_bias")):
        parts[meg] = weights[p + hf]
    parts["out_norm"] = weights[p + "norm.weight"]
    parts["out_proj"] = weights[p + "out_proj.weight"]
    return parts


def main() -> None:
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    hf_dir, megatron_dir = Path(sys.argv[1]), Path(sys.argv[2])
    hf_config = json.loads((hf_dir / "config.json").read_text())
    module = _megatron_module(hf_config)
    sharded = module.sharded_state_dict(prefix=PREFIX)
    sharded = {k: v for k, v in sharded.items() if "_extra_state" not in k}
    loaded = dist_checkpointing.load(
        sharded, str(megatron_dir), strict=StrictHandling.ASSUME_OK_UNEXPECTED
    )
    state = {k.removeprefix(PREFIX): v for k, v in loaded.items()}
    keys = sorted(
        k
        for k in dist_checkpointing.load_tensors_metadata(str(megatron_dir))
        if k.startswith(PREFIX)
    )

    qk, v, nv = module.qk_dim, module.v_dim, module.num_value_heads
    hidden = module.hidden_size
    # megatron-core's forward: in_proj output -> [qkv | gate | beta | alpha], conv on qkv,
    # then qkv -> [query | key | value]
    qkv, gate, beta, alpha = torch.split(state["in_proj.weight"], [2 * qk + v, v, nv, nv])
    query, key, value = torch.split(qkv, [qk, qk, v])
    ours = {
        "query": query.reshape(module.num_key_heads, module.key_head_dim, hidden),
        "key": key.reshape(module.num_key_heads, module.key_head_dim, hidden),
        "value": value.reshape(nv, module.value_head_dim, hidden),
        "z": gate.reshape(nv, module.value_head_dim, hidden),
        "beta": beta,
        "alpha": alpha,
    }
    hf = _hf_parts(hf_dir, hf_config)
    result: dict[str, Any] = {"on_disk_keys": keys}
    for name, t in ours.items():
        # HF parts are [hidden, heads(, dim)]; megatron's [heads(, dim), hidden]
        hf_t = hf[name].permute(*range(1, hf[name].dim()), 0)
        result[name] = t.shape == hf_t.shape and _bytes(t) == _bytes(hf_t)
    for name, key in (
        ("conv1d", "conv1d.weight"),
        ("A_log", "A_log"),
        ("dt_bias", "dt_bias"),
        ("out_proj", "out_proj.weight"),
    ):
        result[name] = _bytes(state[key]) == _bytes(hf[name])
    # Megatron's out_norm is zero-centred (the converter's config and Megatron-Bridge's set
    # layernorm_zero_centered_gamma: it scales by 1 + w); HF's Qwen3NextRMSNormGated scales by
    # w itself. The same scale is w - 1 on the Megatron side, rounded as torch rounds it.
    result["out_norm"] = _bytes(state["out_norm.weight"]) == _bytes(hf["out_norm"] - 1)
    print(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
