"""Writes ``src/mtpcheck/families/definitions.json``: what each decoder layer of a family holds,
as the model's own code builds it.

For every registered family whose ``model_type`` transformers ships, the model is built on the
meta device (no weights) from each config at hand: the family's fixtures, and the published
configs of ``src/mtpcheck/families/published`` scaled down as ``roundtrip --synthetic`` scales
them (one main layer of every kind). Its parameter and buffer names are taken as
``save_pretrained`` writes them (transformers' own ``revert_weight_conversion`` undoes the
fusing it does at load), split into main layers, and each layer's names are reduced to the
parameters the main-model check compares (routed experts folded to ``*``, quantized parts to
their logical parameter). The distinct layers are a family's layer variants.

    python scripts/model_definitions.py           # rewrite the file
    python scripts/model_definitions.py --check   # exit 1 if it would change

``tests/test_definitions.py`` runs ``--check``: a transformers release that renames or adds a
parameter is noticed there.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from mtpcheck.checks.main_layers import layer_names  # noqa: E402
from mtpcheck.convert.tiny_config import scale_down  # noqa: E402
from mtpcheck.families import FAMILIES, MtpFamily, detect_family  # noqa: E402
from mtpcheck.families.catalog import GGUF, MEGATRON, MEGATRON_HYBRID  # noqa: E402
from mtpcheck.families.definitions import DEFINITIONS_FILE  # noqa: E402
from mtpcheck.families.name_templates import LayerNames, NameTemplate  # noqa: E402
from mtpcheck.families.published import PUBLISHED_DIR  # noqa: E402

FIXTURES = ROOT / "fixtures"
PUBLISHED = PUBLISHED_DIR
NOT_MODELS = (MEGATRON, MEGATRON_HYBRID, GGUF)


def _floats(node: dict[str, Any]) -> Any:
    """transformers writes a non-finite float as ``{"__float__": "Infinity"}``."""
    return float(node["__float__"]) if set(node) == {"__float__"} else node


def _configs(family: MtpFamily) -> list[tuple[str, dict[str, Any]]]:
    """(where from, config) of every config at hand for ``family``."""
    found = []
    for path in sorted(FIXTURES.glob("*/config.json")):
        config = json.loads(path.read_text(), object_hook=_floats)
        if detect_family(config) is family:
            found.append((str(path.parent.relative_to(ROOT)), config))
    for path in sorted(PUBLISHED.glob("*.json")):
        config = json.loads(path.read_text(), object_hook=_floats)
        if detect_family(config) is family:
            tiny = scale_down(config, family, str(path))
            found.append((f"{path.relative_to(ROOT)} (scaled down)", tiny.config))
    return found


def _model_names(family: MtpFamily, config: dict[str, Any]) -> list[str] | None:
    """The names ``save_pretrained`` writes for ``config``'s model; None where transformers
    has no class for it."""
    import torch
    import transformers
    from transformers.core_model_loading import revert_weight_conversion

    model_type = family.support.build_as or str(config.get("model_type"))
    if model_type not in transformers.CONFIG_MAPPING:
        return None
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    built = transformers.AutoConfig.for_model(model_type, **kwargs)
    make = transformers.AutoModelForCausalLM.from_config
    for name in config.get("architectures") or ():
        found = getattr(transformers, name, None) if isinstance(name, str) else None
        if isinstance(found, type) and hasattr(found, "_from_config"):
            make = found._from_config
    with torch.device("meta"):
        model = make(built)
    return sorted(revert_weight_conversion(model, model.state_dict()))


def _layers(family: MtpFamily, names: list[str]) -> list[list[str]]:
    template = NameTemplate(family.layout.main_layer_prefix)
    by_layer = LayerNames(names, template.text, None)
    return [sorted(layer_names(by_layer[k])) for k in sorted(by_layer)]


def definitions() -> dict[str, Any]:
    """Every family's layer variants, with the versions and configs they come from."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    families: dict[str, Any] = {}
    without: dict[str, str] = {}
    for family in FAMILIES:
        if family in NOT_MODELS:
            continue
        variants: list[list[str]] = []
        sources, classes, refused = [], set(), []
        for where, config in _configs(family):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    names = _model_names(family, config)
                except Exception as e:  # noqa: BLE001  (the reason is recorded in the file)
                    refused.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
            if names is None:
                continue
            sources.append(where)
            classes.add(str((config.get("architectures") or ["AutoModelForCausalLM"])[0]))
            variants += [v for v in _layers(family, names) if v and v not in variants]
        if variants:
            families[family.key] = {
                "built_by": sorted(classes),
                "configs": sources,
                "layers": sorted(variants),
            }
        elif refused:
            without[family.key] = "transformers cannot build it: " + "; ".join(refused)
        else:
            without[family.key] = (
                "no config at hand" if not _configs(family) else "transformers has no class"
            )
    return {
        "produced_by": {"transformers": transformers.__version__, "torch": torch.__version__},
        "families": families,
        "without_definition": without,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file would change")
    args = parser.parse_args()
    built = definitions()
    text = json.dumps(built, indent=1, sort_keys=True) + "\n"
    if args.check:
        # what the model code builds must agree; the versions that built it may differ
        shipped = json.loads(DEFINITIONS_FILE.read_text())
        made = shipped["produced_by"]
        if {k: v for k, v in shipped.items() if k != "produced_by"} != {
            k: v for k, v in built.items() if k != "produced_by"
        }:
            print(
                f"{DEFINITIONS_FILE.relative_to(ROOT)} (transformers {made['transformers']}) "
                f"differs from what transformers {built['produced_by']['transformers']} "
                f"builds: run python {Path(__file__).relative_to(ROOT)}"
            )
            return 1
        return 0
    DEFINITIONS_FILE.write_text(text)
    print(f"wrote {DEFINITIONS_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
