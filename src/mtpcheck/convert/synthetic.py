"""Build a tiny random checkpoint of a real checkpoint's family, for a fast round trip.

From a real ``config.json`` this keeps the family, the MTP depth, the storage dtype and the
tensor naming, and scales every dimension down (:mod:`mtpcheck.convert.tiny_config`: one main
layer of every kind the config has): the main model comes from the family's real transformers
class (written with ``save_pretrained``), the MTP layers are added from the family registry's
layout (each MTP block, or each flat layer of a depth, mirrors a main decoder layer of its kind).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mtpcheck.convert.tiny_config import TinyConfig, scale_down
from mtpcheck.convert.tiny_config import language as language_of
from mtpcheck.errors import ConfigError, InputError
from mtpcheck.families import MtpFamily, declared_count, detect_family, fill_template
from mtpcheck.families.layout import flat_patterns, hidden_layer_count
from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.formats.config_json import read_config
from mtpcheck.model.config_keys import TEXT_ROOTS, text_value
from mtpcheck.torch_threads import configure_torch_threads


def synthetic_config(source: Path) -> tuple[Path, dict[str, Any], MtpFamily]:
    """The ``config.json`` ``--synthetic`` builds from (``source`` is the file or its folder),
    read, and its family; a config of no known MTP family is refused (exit 2)."""
    config_path = source / "config.json" if source.is_dir() else source
    if not config_path.is_file():
        raise InputError(source, "--synthetic needs a config.json (or a folder holding one)")
    config = read_config(config_path)
    family = detect_family(config)
    if family is None:
        what = f"model_type {config.get('model_type')!r}"
        raise InputError(config_path, f"--synthetic does not know {what} as an MTP family")
    return config_path, config, family


def build_synthetic(
    source: Path, dst: Path, seed: int = 0, log: Callable[[str], None] | None = None
) -> Path:
    """Write a tiny checkpoint shaped like ``source`` (a config.json or its folder) to ``dst``;
    ``log`` is told what the tiny checkpoint leaves out of the real one."""
    config_path, config, family = synthetic_config(source)
    count = declared_count(config, family, str(config_path)).value or 0
    tiny = scale_down(config, family, str(config_path))
    if log is not None:
        kept = ", ".join(map(str, tiny.kept_layers))
        log(f"synthetic: main layers {kept} of the real model kept (one of each kind)")
        for note in tiny.notes:
            log(f"synthetic: {note}")
    configure_torch_threads()  # transformers builds the model next: see mtpcheck.torch_threads
    tensors, built = _main_model(tiny, config, config_path, seed, family)
    tensors.update(_mtp_tensors(tensors, built, family, count, seed))
    return _write(dst, tensors, config, built, family)


def _main_model(
    tiny: TinyConfig, original: dict[str, Any], where: Path, seed: int, family: MtpFamily
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The main model, built from the tiny config with transformers' class of the config's
    ``model_type`` (or the family's ``build_as``, for a family without a class of its own),
    and the config transformers saved with it."""
    import torch
    import transformers
    from safetensors.torch import load_file

    model_type = family.support.build_as or str(original.get("model_type"))
    kwargs = {k: v for k, v in tiny.config.items() if k not in ("model_type", "architectures")}
    transformers.utils.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except ValueError as e:
        if model_type not in transformers.CONFIG_MAPPING:
            raise InputError(
                where,
                f"transformers {transformers.__version__} has no model class for model_type "
                f"{model_type!r} ({family.display} releases ship remote code), so --synthetic "
                "cannot build its main model",
            ) from e
        raise ConfigError(where, f"transformers refuses the scaled-down config: {e}") from e
    torch.manual_seed(seed)
    model = _model_class(transformers, original)(config)
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


def _model_class(transformers: Any, original: Mapping[str, Any]) -> Callable[[Any], Any]:
    """How to build the model: the config's own architecture where transformers has it (a
    vision-language release's ``...ForConditionalGeneration``, whose names hold the language
    model's under its own prefix), else the causal LM class of its model type."""
    for name in original.get("architectures") or ():
        found = getattr(transformers, name, None) if isinstance(name, str) else None
        if isinstance(found, type) and hasattr(found, "_from_config"):
            return found._from_config  # type: ignore[no-any-return]
    return transformers.AutoModelForCausalLM.from_config  # type: ignore[no-any-return]


def _storage_dtype(config: Mapping[str, Any]) -> str:
    found = text_value(config, "dtype") or text_value(config, "torch_dtype")
    return str(found[1]) if found and found[1] else "bfloat16"


def _reference_layer(
    tensors: Mapping[str, Any], prefix: str, layers: int, kinds: list[Any], wanted: Any
) -> str:
    """The main layer an MTP block (or one flat layer of a depth) mirrors: the first main layer
    of the flat layer's pattern entry, else the last main layer with full attention."""
    template = NameTemplate(prefix)
    if wanted is not None and wanted in kinds:
        return template.main_layer(kinds.index(wanted))
    for k in reversed(range(layers)):
        here = template.main_layer(k)
        if any(n.startswith(here + "self_attn.") for n in tensors):
            return here
    return template.main_layer(layers - 1)


def _mtp_tensors(
    tensors: dict[str, Any], built: dict[str, Any], family: MtpFamily, count: int, seed: int
) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    language = language_of(built)
    hidden, vocab = int(language["hidden_size"]), int(language["vocab_size"])
    layers = hidden_layer_count(family, built)
    if layers is None:
        raise ConfigError("config.json", "transformers saved no layer count for the tiny model")
    mtp_kinds, main_kinds = flat_patterns(family, built)
    span = max(1, len(mtp_kinds))
    embedding = next(n for n in family.layout.main_shared if n in tensors)
    dtype = tensors[embedding].dtype
    out: dict[str, Any] = {}

    def fresh(shape: tuple[int, ...], like: Any = None) -> Any:
        noise = torch.randn(shape, generator=gen) * 0.02
        base = like.float() if like is not None and like.dim() <= 1 else 0.0
        return (noise + base).to(like.dtype if like is not None else dtype)

    for flat in range(count * span):
        prefix = fill_template(family.layout.layer_prefix, flat, layers, span)
        wanted = mtp_kinds[flat % span] if mtp_kinds else None
        ref = _reference_layer(tensors, family.layout.main_layer_prefix, layers, main_kinds, wanted)
        for name, t in tensors.items():
            if name.startswith(ref):
                out[prefix + name[len(ref) :]] = fresh(tuple(t.shape), t)
    for i in range(count):
        for template in family.layout.specific:
            if NameTemplate(template).fixed and i > 0:
                continue
            name = fill_template(template, i, layers, span)
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
    for key in ("model_type", "architectures", "dtype"):
        if key in original:
            config[key] = original[key]
    for key in family.count.keys:  # the count as the real config declares it, where it does
        for root in TEXT_ROOTS:
            _drop(config, root + key)  # (transformers writes its own default beside)
        found = text_value(original, key)
        if found is not None:
            _set(config, found[0], found[1])
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dst


def _drop(config: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
