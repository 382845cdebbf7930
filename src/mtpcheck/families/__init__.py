"""MTP family registry and the pure functions that locate MTP layers."""

from mtpcheck.families.catalog import FAMILIES, FAMILY_BY_MODEL_TYPE, FAMILY_BY_NAME
from mtpcheck.families.interface import (
    ChainHidden,
    ConcatOrder,
    CopyPolicy,
    Drafter,
    MtpFamily,
    SharedCopy,
)
from mtpcheck.families.layout import (
    DeclaredCount,
    MtpAnalysis,
    analyse,
    declared_count,
    depth_span,
    detect_family,
    hidden_layer_count,
    summarise,
)
from mtpcheck.families.name_templates import fill_template

__all__ = [
    "FAMILIES",
    "FAMILY_BY_MODEL_TYPE",
    "FAMILY_BY_NAME",
    "ChainHidden",
    "ConcatOrder",
    "CopyPolicy",
    "DeclaredCount",
    "Drafter",
    "MtpAnalysis",
    "MtpFamily",
    "SharedCopy",
    "analyse",
    "declared_count",
    "depth_span",
    "hidden_layer_count",
    "detect_family",
    "fill_template",
    "summarise",
]
