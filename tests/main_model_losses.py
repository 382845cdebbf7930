"""One main-model tensor taken out of an opened checkpoint, and whether ``main-model`` finds
and names the loss (names and headers only: the check reads no bytes). Shared by
``tests/test_main_model.py`` and ``benchmarks/main_model_coverage.py``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.families import MtpAnalysis, analyse
from mtpcheck.model import TensorMeta


class Without:
    """A checkpoint as opened, less some tensors."""

    def __init__(self, ckpt: Any, tensors: Mapping[str, TensorMeta]) -> None:
        self.path, self.format, self.naming = ckpt.path, ckpt.format, ckpt.naming
        self.config, self.config_path = ckpt.config, ckpt.config_path
        self.tensors, self.issues, self.cross_checked = tensors, (), ckpt.cross_checked

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        raise AssertionError("main-model reads no tensor bytes")


def layer_of(name: str, template: str) -> str:
    """``main layer K`` for a tensor of main layer K (``template``: the family's main layer
    prefix), else the name itself."""
    head = template.split("{k}")[0]
    number = name[len(head) :].split(".")[0] if name.startswith(head) else ""
    return f"main layer {number}" if number.isdigit() else name


def main_tensors(ckpt: Any, analysis: MtpAnalysis) -> tuple[list[str], list[str]]:
    """(the embedding, final norm and head present, every main layer's tensor) of ``ckpt``."""
    family = analysis.family
    assert family is not None
    top = [n for n in (*family.layout.main_shared, family.layout.main_norm) if n in ckpt.tensors]
    layers = sorted(
        n
        for n in ckpt.tensors
        if n not in analysis.mtp_names and layer_of(n, family.layout.main_layer_prefix) != n
    )
    return top, layers


def loss_is_named(ckpt: Any, analysis: MtpAnalysis, lost: str) -> bool:
    """Whether ``main-model`` fails on ``ckpt`` without tensor ``lost`` and names the tensor
    or its layer."""
    family = analysis.family
    assert family is not None
    tensors = {n: m for n, m in ckpt.tensors.items() if n != lost}
    check = main_model_check(
        Without(ckpt, tensors), analyse(ckpt.config, tensors, ckpt.config_path)
    )
    text = " ".join(f"{f.subject}: {f.message}" for f in check.findings)
    layer = layer_of(lost, family.layout.main_layer_prefix)
    named = lost in text or f"{layer}:" in text or f"{layer} (" in text
    return check.status.value == "fail" and named


def every_layer_losses(ckpt: Any, analysis: MtpAnalysis) -> list[tuple[str, list[str]]]:
    """(relative name, every main layer's tensor of that name) for each name a main layer
    holds: what a converter that never writes one kind of tensor loses."""
    family = analysis.family
    assert family is not None
    head = family.layout.main_layer_prefix.split("{k}")[0]
    _, layers = main_tensors(ckpt, analysis)
    by_rel: dict[str, list[str]] = {}
    for name in layers:
        rel = name[len(head) :].split(".", 1)[1]
        by_rel.setdefault(rel, []).append(name)
    return sorted(by_rel.items())


def losses_are_named(ckpt: Any, analysis: MtpAnalysis, lost: list[str], rel: str) -> bool:
    """Whether ``main-model`` fails on ``ckpt`` without the tensors ``lost`` (one relative
    name ``rel`` in every layer holding it) and names the name."""
    gone = set(lost)
    tensors = {n: m for n, m in ckpt.tensors.items() if n not in gone}
    check = main_model_check(
        Without(ckpt, tensors), analyse(ckpt.config, tensors, ckpt.config_path)
    )
    text = " ".join(f"{f.subject}: {f.message}" for f in check.findings)
    family = analysis.family
    assert family is not None
    layers = {layer_of(n, family.layout.main_layer_prefix) for n in lost}
    named = rel in text or any(f"{x}:" in text or f"{x} (" in text for x in layers)
    return check.status.value == "fail" and named
