"""Build a tiny random checkpoint of a real checkpoint's family, for a fast round trip.

From a real ``config.json`` this keeps the family, the MTP depth, the storage dtype and the
tensor naming, and scales every dimension down: the main model comes from the family's real
transformers class (written with ``save_pretrained``), the MTP layers are added from the
family registry's layout (each MTP block mirrors a main decoder layer).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError
from mtpcheck.families import MtpFamily, detect_family, fill_template
from mtpcheck.families.layout import declared_count
from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.formats.config_json import read_config
from mtpcheck.torch_threads import configure_torch_threads

TINY_DIMS: dict[str, int] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "moe_intermediate_size": 8,
    "shared_expert_intermediate_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "q_lora_rank": 12,
    "kv_lora_rank": 8,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "n_routed_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "full_attention_interval": 2,
    "linear_conv_kernel_dim": 2,
    "linear_key_head_dim": 4,
    "linear_value_head_dim": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "index_topk": 8,
    "index_head_dim": 8,
    "index_n_heads": 2,
}
MAIN_LAYERS = 2
DROPPED = ("layer_types", "mlp_layer_types", "quantization_config", "auto_map")


def tiny_config(config: dict[str, Any]) -> dict[str, Any]:
    """Scale ``config`` down: known dimensions shrink, structure keys stay."""
    tiny = {k: v for k, v in config.items() if k not in DROPPED}
    for key, value in TINY_DIMS.items():
        if key in tiny:
            tiny[key] = value
    if "num_key_value_heads" not in config and "num_attention_heads" in config:
        tiny["num_key_value_heads"] = tiny["num_attention_heads"]
    tiny["num_hidden_layers"] = MAIN_LAYERS
    tiny["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", False))
    return tiny


def _storage_dtype(config: dict[str, Any]) -> str:
    return str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")


def build_synthetic(source: Path, dst: Path, seed: int = 0) -> Path:
    """Write a tiny checkpoint shaped like ``source`` (a config.json or its folder) to ``dst``."""
    config_path = source / "config.json" if source.is_dir() else source
    if not config_path.exists():
        raise InputError(source, "--synthetic needs a config.json (or a folder holding one)")
    config = read_config(config_path)
    family = detect_family(config)
    if family is None or family.megatron is None:
        what = family.display if family else f"model_type {config.get('model_type')!r}"
        raise InputError(config_path, f"--synthetic does not support {what} yet")
    count = declared_count(config, family, str(config_path)).value
    configure_torch_threads()  # transformers builds the model next: see mtpcheck.torch_threads
    tensors, built = _main_model(tiny_config(config), config, seed, family.support.build_as)
    tensors.update(_mtp_tensors(tensors, built, family, count or 0, seed))
    return _write(dst, tensors, config, built, family)


def _main_model(
    tiny: dict[str, Any], original: dict[str, Any], seed: int, build_as: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The main model, built from ``tiny`` with transformers' class of the config's
    ``model_type`` (or ``build_as``, for a family without a class of its own)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    model_type = build_as or str(original.get("model_type"))
    kwargs = {k: v for k, v in tiny.items() if k not in ("model_type", "architectures")}
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    dtype = getattr(torch, _storage_dtype(original))
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors: dict[str, Any] = {}
        for path in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(path))
        built = json.loads((Path(tmp) / "config.json").read_text())
    for name, t in tensors.items():
        keep = name.endswith("e_score_correction_bias") or not t.is_floating_point()
        tensors[name] = t.contiguous() if keep else t.to(dtype).contiguous()
    return tensors, built


def _reference_layer(tensors: dict[str, Any], layers: int) -> str:
    """The last main layer with full attention (what an MTP block is built from)."""
    for k in reversed(range(layers)):
        if any(n.startswith(f"model.layers.{k}.self_attn.") for n in tensors):
            return f"model.layers.{k}."
    return f"model.layers.{layers - 1}."


def _mtp_tensors(
    tensors: dict[str, Any], built: dict[str, Any], family: MtpFamily, count: int, seed: int
) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    hidden, vocab = built["hidden_size"], built["vocab_size"]
    layers = built["num_hidden_layers"]
    dtype = tensors["model.embed_tokens.weight"].dtype
    ref = _reference_layer(tensors, layers)
    out: dict[str, Any] = {}

    def fresh(shape: tuple[int, ...], like: Any = None) -> Any:
        noise = torch.randn(shape, generator=gen) * 0.02
        base = like.float() if like is not None and like.dim() <= 1 else 0.0
        return (noise + base).to(like.dtype if like is not None else dtype)

    for i in range(count):
        prefix = fill_template(family.layout.layer_prefix, i, layers)
        for name, t in tensors.items():
            if name.startswith(ref):
                out[prefix + name[len(ref) :]] = fresh(tuple(t.shape), t)
        for template in family.layout.specific:
            if NameTemplate(template).fixed and i > 0:
                continue
            name = fill_template(template, i, layers)
            if template == family.layout.projection:
                out[name] = fresh((hidden, 2 * hidden))
            elif name.endswith(("head.weight", "output.weight")):
                out[name] = fresh((vocab, hidden))
            else:
                out[name] = fresh((hidden,), torch.ones(hidden, dtype=dtype))
        for copy in family.layout.copies:
            name = fill_template(copy.template, i, layers)
            if copy.main in tensors:
                out[name] = tensors[copy.main].clone()
    return out


def _write(
    dst: Path,
    tensors: dict[str, Any],
    original: dict[str, Any],
    built: dict[str, Any],
    family: MtpFamily,
) -> Path:
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    save_file(
        dict(sorted(tensors.items())), str(dst / "model.safetensors"), metadata={"format": "pt"}
    )
    config = dict(built)
    for key in ("model_type", "architectures", *family.count.keys, "dtype"):
        if key in original:
            config[key] = original[key]
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dst
