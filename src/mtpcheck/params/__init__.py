"""Logical parameters: a checkpoint's stored tensors grouped into the parameters they hold,
each part with its role (weight, packed weight, scale, zero point, ...), and the
quantization scheme a config declares. Sits between ``formats`` (stored tensors) and
``families`` (which parameters an MTP layer must have)."""

from mtpcheck.params.grouping import (
    LogicalParam,
    group,
    logical_name,
    quantized_modules,
    stored_forms,
)
from mtpcheck.params.parts import (
    FUSED_EXPERTS,
    PARTS,
    STACKED_EXPERTS,
    Method,
    Role,
    StoredPart,
)
from mtpcheck.params.scheme import Rounding, Scheme, declared_scheme, scheme_of

__all__ = [
    "FUSED_EXPERTS",
    "PARTS",
    "STACKED_EXPERTS",
    "LogicalParam",
    "Method",
    "Role",
    "Rounding",
    "Scheme",
    "StoredPart",
    "declared_scheme",
    "group",
    "logical_name",
    "quantized_modules",
    "scheme_of",
    "stored_forms",
]
