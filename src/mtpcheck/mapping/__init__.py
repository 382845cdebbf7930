"""HF <-> Megatron correspondence: name rules, bit-exact transforms, mapped views."""

from mtpcheck.layouts import MegatronLayout
from mtpcheck.mapping.plan import MappingError, Plan, TensorMapping, build_plan, mapped_families
from mtpcheck.mapping.views import MappedCheckpoint, as_hf, as_megatron

__all__ = [
    "MappedCheckpoint",
    "MappingError",
    "MegatronLayout",
    "Plan",
    "TensorMapping",
    "as_hf",
    "as_megatron",
    "build_plan",
    "mapped_families",
]
