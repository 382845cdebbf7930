"""The MTP family registry: one entry per family, as data, gathered from one module per
layout style. A family is one record in the module of its style:

* :mod:`~mtpcheck.families.catalog_deepseek`: MTP layers appended after the decoder
  (``model.layers.{n}.``: DeepSeek, GLM, Kimi, Step, Hunyuan HY-V3, Bailing, ...);
* :mod:`~mtpcheck.families.catalog_qwen`: Qwen3-Next's top-level ``mtp.`` block (Qwen3.5,
  EXAONE, ...);
* :mod:`~mtpcheck.families.catalog_module`: megatron-core's MTP module names (MiniMax,
  Hunyuan HY-V4, Nemotron-H's hybrid stack);
* :mod:`~mtpcheck.families.catalog_own`: names of their own (MiMo, ERNIE, LongCat,
  DeepSeek-V4) and Gemma 4's separate drafter;
* :mod:`~mtpcheck.families.catalog_formats`: checkpoint formats whatever the model (Megatron,
  GGUF).

Facts and their sources are collected in docs/families.md (its tables are built from here).
The registry's order is the modules' in that list, each module's its own: a config whose
``architectures`` two families share is the first one's.
"""

from __future__ import annotations

from mtpcheck.families.catalog_deepseek import DEEPSEEK_STYLE
from mtpcheck.families.catalog_formats import (
    FORMATS,
    GGUF,
    HYBRID_MTP_PATTERN,
    MEGATRON,
    MEGATRON_HYBRID,
)
from mtpcheck.families.catalog_module import MODULE_STYLE
from mtpcheck.families.catalog_own import OWN_LAYOUTS
from mtpcheck.families.catalog_qwen import QWEN_STYLE
from mtpcheck.families.interface import MtpFamily

__all__ = [
    "FAMILIES",
    "FAMILY_BY_MODEL_TYPE",
    "FAMILY_BY_NAME",
    "GENERIC_COUNT_KEYS",
    "GGUF",
    "HYBRID_MTP_PATTERN",
    "MEGATRON",
    "MEGATRON_HYBRID",
]

FAMILIES: tuple[MtpFamily, ...] = (
    *DEEPSEEK_STYLE,
    *QWEN_STYLE,
    *MODULE_STYLE,
    *OWN_LAYOUTS,
    *FORMATS,
)

FAMILY_BY_NAME: dict[str, MtpFamily] = {f.key: f for f in FAMILIES}
FAMILY_BY_MODEL_TYPE: dict[str, MtpFamily] = {t: f for f in FAMILIES for t in f.model_types}

GENERIC_COUNT_KEYS = (
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "num_mtp_layers",
    "mtp_num_layers",
    "num_mtp_modules",
    "mtp_config.num_nextn_predict_layers",
)
"""Count keys tried, in order, for a checkpoint of unknown family."""
