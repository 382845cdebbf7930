"""MTP tensors must have the shapes the config and the main layers they mirror imply.

A transposed or resized MTP tensor still has its name, so completeness and the count pass it;
a serving engine then fails to load it, or loads it wrongly. Three expectations, each only
where its inputs are known: the projection is ``[H, 2H]`` (``[H, H]`` for families that
project embedding and hidden state apart), the norms of the MTP head are ``[H]``, and a tensor of an
MTP block has the shape of the same tensor in the main decoder layer the block mirrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtpcheck.dtypes import is_fp8, is_high_precision
from mtpcheck.families import ConcatOrder, Drafter, MtpAnalysis, MtpFamily
from mtpcheck.families.name_templates import matches_template
from mtpcheck.model import CheckName, CheckResult, Finding, Status, TensorMeta
from mtpcheck.model.config_keys import is_int, text_value
from mtpcheck.params import logical_name

NAME = CheckName.MTP_SHAPES
TITLE = "MTP tensor shapes"


def hidden_size(config: Mapping[str, Any]) -> int | None:
    """The model width, where the config states it as a positive integer."""
    found = text_value(config, "hidden_size", lambda v: is_int(v) and v > 0)
    return found[1] if found else None


def _norms(family: MtpFamily) -> tuple[str, ...]:
    """Templates of the MTP-only norms known to be ``[H]``: the embedding, hidden and final
    norms of the family's MTP head, where the registry names them (a family with
    hyper-connections normalises a state several H wide)."""
    parts = family.layout.head_parts
    return (parts[0], parts[1], parts[3]) if parts else ()


def _wrapper_expectations(
    family: MtpFamily, hidden: int, name: str
) -> tuple[tuple[int, ...], str] | None:
    """The shape an MTP-only tensor must have, and how it follows from ``hidden``."""
    if family.layout.projection and matches_template(family.layout.projection, name):
        if family.layout.concat_order is ConcatOrder.SPLIT:
            return (hidden, hidden), f"[hidden_size, hidden_size] with hidden_size {hidden}"
        return (hidden, 2 * hidden), f"[hidden_size, 2 * hidden_size] with hidden_size {hidden}"
    for template in _norms(family):
        if matches_template(template, name):
            return (hidden,), f"[hidden_size] with hidden_size {hidden}"
    return None


def _mirror_of(analysis: MtpAnalysis, name: str) -> str | None:
    """The main-layer tensor that ``name`` (in an MTP block) mirrors, by its relative name."""
    for block, main in analysis.mirrors:
        if name.startswith(block):
            return main + name[len(block) :]
    return None


def _element_per_value(dtype: str) -> bool:
    """Whether a tensor of ``dtype`` stores one value per element, so that its shape is the
    parameter's (not FP4 pairs in U8 under the weight's own name, as modelopt writes NVFP4)."""
    return is_high_precision(dtype) or is_fp8(dtype) or dtype == "I8"


def _comparable(a: str, b: str) -> bool:
    """Shapes compare where both tensors are stored alike (a BF16 MTP weight beside an NVFP4
    main weight has a packed shape to compare with, not the parameter's)."""
    return a == b or (_element_per_value(a) and _element_per_value(b))


def _skip(reason: str) -> CheckResult:
    return CheckResult(NAME, TITLE, (Finding("mtp shapes", Status.SKIP, reason),))


def shapes_check(
    analysis: MtpAnalysis, tensors: Mapping[str, TensorMeta], config: Mapping[str, Any]
) -> CheckResult:
    """One FAIL per MTP tensor whose shape disagrees; one PASS line when none does."""
    family = analysis.family
    if family is None:
        return _skip("family unknown: expected shapes not known")
    if family.drafter is not Drafter.INSIDE:
        return _skip("no MTP layers inside this checkpoint")
    names = [n for layer in analysis.layers for n in layer.present]
    if not names:
        return _skip("no MTP layers present")
    hidden = hidden_size(config)
    findings = []
    checked = 0
    for name in names:
        if logical_name(name)[1].sized_by_content:
            continue
        shape = tensors[name].shape
        whole = _element_per_value(tensors[name].dtype)
        expected = _wrapper_expectations(family, hidden, name) if hidden and whole else None
        mirror = _mirror_of(analysis, name)
        if (
            expected is None
            and mirror is not None
            and mirror in tensors
            and _comparable(tensors[name].dtype, tensors[mirror].dtype)
        ):
            expected = tensors[mirror].shape, f"as {mirror}, the main-layer tensor it mirrors"
        if expected is None:
            continue
        checked += 1
        want, why = expected
        if shape != want:
            findings.append(
                Finding(
                    name,
                    Status.FAIL,
                    f"shape {list(shape)}, expected {list(want)} ({why})",
                    {"shape": list(shape), "expected": list(want)},
                )
            )
    if findings:
        return CheckResult(NAME, TITLE, tuple(findings))
    width = f"hidden_size {hidden}" if hidden else "no hidden_size in the config"
    message = (
        f"{checked} of {len(names)} MTP tensors checked ({width}; block tensors against the "
        "main layers they mirror): all as expected"
    )
    return CheckResult(NAME, TITLE, (Finding("mtp shapes", Status.PASS, message),))
