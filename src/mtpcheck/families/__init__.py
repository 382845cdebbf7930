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
    detect_family,
    summarise,
)

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
    "detect_family",
    "summarise",
]
