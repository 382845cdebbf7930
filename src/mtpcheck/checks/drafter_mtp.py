"""An MTP layer taken out of its target (SGLang's NextN export, speculators' MTP format, a
standalone head) against the target's own MTP layer, bit for bit, in the drafter's names.

An extraction has its own scope: the main model is absent and the layer count changed on
purpose, and the exporter may leave out the embedding and head the target shares. Everything
else of the target's MTP layer must be in the drafter, byte for byte; fused experts
(transformers 5's ``gate_up_proj``) are compared slice by slice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mtpcheck.checks.findings import comparison_finding, status_of
from mtpcheck.checks.stacked_experts import unfused
from mtpcheck.families import MtpAnalysis
from mtpcheck.families.drafter_kinds import DrafterKind
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    Status,
    TensorComparison,
    TensorStatus,
)
from mtpcheck.units import first_few

Compare = Callable[[Checkpoint, Checkpoint, Sequence[tuple[str, str]]], Sequence[TensorComparison]]

_TITLE = "Drafter against the target's MTP layer"


@dataclass(frozen=True)
class Extraction:
    """The target's MTP tensors paired with the drafter's names."""

    pairs: tuple[tuple[str, str], ...]
    """(target name, drafter name) of every target MTP tensor the drafter should hold."""
    dropped: tuple[str, ...]
    """Target MTP tensors the extraction leaves out on purpose."""
    unpaired: tuple[str, ...]
    """Drafter tensors no target MTP tensor maps to."""


def _drafter_name(kind: DrafterKind, name: str, mtp_prefix: str) -> str | None:
    for theirs, mine in kind.renames:
        theirs = theirs.replace("{mtp}", mtp_prefix)
        if name.startswith(theirs):
            return mine + name[len(theirs) :]
    return None


def pair_names(kind: DrafterKind, drafter: Checkpoint, analysis: MtpAnalysis) -> Extraction:
    """Pair the first MTP layer of the target (``analysis``) with ``drafter``'s names."""
    first = analysis.layers[0]
    pairs, dropped = [], []
    for name in sorted(first.present):
        if any(name.endswith(end) for end in kind.dropped):
            dropped.append(name)
            continue
        mine = _drafter_name(kind, name, first.prefix)
        if mine is not None:
            pairs.append((name, mine))
    mapped = {m for _, m in pairs}
    unpaired = tuple(sorted(n for n in drafter.tensors if n not in mapped and n not in kind.unused))
    return Extraction(tuple(pairs), tuple(dropped), unpaired)


def mtp_extract_check(
    drafter: Checkpoint,
    kind: DrafterKind,
    target: Checkpoint,
    analysis: MtpAnalysis,
    compare: Compare,
) -> tuple[CheckResult, tuple[TensorComparison, ...]]:
    """The drafter's tensors against the target's first MTP layer; the comparisons made."""
    if not analysis.layers or not analysis.layers[0].present:
        finding = Finding(
            "target",
            Status.SKIP,
            "the target holds no MTP layer to compare with (a build that strips it and "
            "ships the head apart)",
        )
        return CheckResult(CheckName.DRAFTER_MTP, _TITLE, (finding,)), ()
    view = unfused(drafter)
    found = pair_names(kind, view, analysis)
    comparisons = tuple(compare(target, view, list(found.pairs)))
    lost = [m for c, (_, m) in zip(comparisons, found.pairs, strict=True) if _absent(c)]
    bad = [
        _finding(c, mine)
        for c, (_, mine) in zip(comparisons, found.pairs, strict=True)
        if not _absent(c) and status_of(c) is not Status.PASS
    ]
    if lost:
        bad.insert(0, _left_out(lost, len(found.pairs)))
    if not bad:
        size = sum(c.nbytes for c in comparisons)
        kept = f"; left out on purpose: {first_few(found.dropped, 3)}" if found.dropped else ""
        unused = [n for n in kind.unused if n in drafter.tensors]
        kept += f"; stored and never read: {first_few(unused, 2)}" if unused else ""
        bad = [
            Finding(
                "mtp layer",
                Status.PASS,
                f"{len(comparisons)} tensors bit-identical to the target's "
                f"{analysis.layers[0].prefix}* ({size} bytes){kept}",
            )
        ]
    if found.unpaired:
        bad.append(
            Finding(
                "unpaired",
                Status.WARN,
                f"{len(found.unpaired)} drafter tensors match no tensor of the target's MTP "
                f"layer: {first_few(found.unpaired, 3)}",
            )
        )
    return CheckResult(CheckName.DRAFTER_MTP, _TITLE, tuple(bad)), comparisons


def _absent(c: TensorComparison) -> bool:
    return c.status is TensorStatus.MISSING


def _left_out(lost: list[str], total: int) -> Finding:
    return Finding(
        "left out",
        Status.FAIL,
        f"{len(lost)} of the target MTP layer's {total} tensors are absent from the drafter "
        f"(an exporter that skipped what it could not read): {first_few(lost, 4)}",
        {"missing": lost},
    )


def _finding(c: TensorComparison, mine: str) -> Finding:
    if c.status is TensorStatus.NOT_COMPARED:
        return Finding(mine, Status.SKIP, "not compared: bytes not at hand (--fetch reads them)")
    return replace(comparison_finding(c, "target", "drafter"), subject=mine)
