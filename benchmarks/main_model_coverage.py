"""How much of a main model's loss ``main-model`` finds: each shipped fixture with one of its
main-model tensors taken out, one tensor at a time, for every tensor (names and headers only:
the check reads no bytes). Prints, per fixture, the losses found (the finding names the tensor
or its layer) against those tried, and the tensors whose loss went unseen.

    python benchmarks/main_model_coverage.py
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.families import analyse
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import TensorMeta

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class _Without:
    """A checkpoint as opened, less some tensors."""

    def __init__(self, ckpt: Any, tensors: Mapping[str, TensorMeta]) -> None:
        self.path, self.format, self.naming = ckpt.path, ckpt.format, ckpt.naming
        self.config, self.config_path = ckpt.config, ckpt.config_path
        self.tensors, self.issues, self.cross_checked = tensors, (), ckpt.cross_checked

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        raise AssertionError("main-model reads no tensor bytes")


def _layer_of(name: str, template: str) -> str:
    head = template.split("{k}")[0]
    number = name[len(head) :].split(".")[0] if name.startswith(head) else ""
    return f"main layer {number}" if number.isdigit() else name


def coverage(root: Path) -> tuple[int, list[str]]:
    """(tensors tried, the ones whose loss was not found)."""
    ckpt = open_checkpoint(root)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    family = analysis.family
    assert family is not None
    top = {*family.main_shared, family.main_norm}
    tried = [
        n
        for n in ckpt.tensors
        if n not in analysis.mtp_names and (n in top or _layer_of(n, family.main_layer_prefix) != n)
    ]
    missed = []
    for lost in tried:
        tensors = {n: m for n, m in ckpt.tensors.items() if n != lost}
        damaged = _Without(ckpt, tensors)
        check = main_model_check(damaged, analyse(ckpt.config, tensors, ckpt.config_path))
        text = " ".join(f"{f.subject}: {f.message}" for f in check.findings)
        layer = _layer_of(lost, family.main_layer_prefix)
        named = lost in text or f"{layer}:" in text or f"{layer} (" in text
        if check.status.value != "fail" or not named:
            missed.append(lost)
    return len(tried), missed


def main() -> int:
    found = total = 0
    for config in sorted(FIXTURES.glob("*/config.json")):
        tried, missed = coverage(config.parent)
        total += tried
        found += tried - len(missed)
        print(f"{config.parent.name:20s} {tried - len(missed):4d} of {tried:4d}", end="  ")
        print(f"unseen: {', '.join(missed[:3])}{' ...' if len(missed) > 3 else ''}")
    print(f"all fixtures: {found} of {total} single-tensor losses found ({found / total:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
