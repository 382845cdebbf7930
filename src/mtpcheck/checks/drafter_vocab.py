"""A drafter's reduced vocabulary and its two maps (EAGLE-3, P-EAGLE): ``d2t[i]`` is added to
draft id ``i`` to give the target id, ``t2d`` marks the target ids the drafter can propose.

speculators refuses maps of the wrong length or count; vLLM loads a drafter without ``d2t``
and leaves its table zero, so draft id ``i`` becomes target id ``i`` and acceptance collapses
with nothing in the logs. The maps are small (one id per draft token, one flag per target
token): their bytes are read whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mtpcheck.dtypes import DTYPES, Kind
from mtpcheck.families.drafter_kinds import DrafterKind
from mtpcheck.families.drafters import DrafterConfig
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    HeadersOnly,
    Status,
    read_whole,
)

if TYPE_CHECKING:
    import numpy as np

_TITLE = "Draft vocabulary maps (d2t, t2d)"


def _result(*findings: Finding) -> CheckResult:
    return CheckResult(CheckName.DRAFTER_VOCAB, _TITLE, findings)


def _absent(draft: int | None, vocab: int | None) -> CheckResult:
    if draft is not None and vocab is not None and draft < vocab:
        return _result(
            Finding(
                "d2t",
                Status.FAIL,
                f"draft vocabulary {draft} < target vocabulary {vocab} but no d2t / t2d: vLLM "
                "then maps draft id i to target id i, and acceptance collapses",
            )
        )
    said = "the target's" if draft is None else f"{draft}, the target's whole vocabulary"
    return _result(Finding("d2t", Status.PASS, f"no maps, none needed: draft vocabulary {said}"))


def _shape_findings(cp: Checkpoint, draft: int | None, vocab: int | None) -> list[Finding]:
    found = []
    for name, want, what in (("d2t", draft, "draft"), ("t2d", vocab, "target")):
        meta = cp.tensors[name]
        kind = DTYPES[meta.dtype].kind if meta.dtype in DTYPES else None
        if len(meta.shape) != 1 or (want is not None and meta.shape[0] != want):
            found.append(
                Finding(
                    name, Status.FAIL, f"shape {list(meta.shape)}, not [{want}] ({what} vocabulary)"
                )
            )
        elif kind not in (Kind.INT, Kind.UINT, Kind.BOOL):
            found.append(Finding(name, Status.FAIL, f"dtype {meta.dtype}, not an integer type"))
    return found


def _array(cp: Checkpoint, name: str) -> np.ndarray:
    """Tensor ``name``'s values as a numpy array (its bytes read whole: the maps are small,
    and an array holds them in about the bytes read)."""
    import numpy as np

    meta = cp.tensors[name]
    dtype = DTYPES[meta.dtype].numpy or "uint8"
    return np.frombuffer(bytes(read_whole(cp, name)), dtype=dtype)


def _map_findings(cp: Checkpoint, draft: int | None, vocab: int | None) -> list[Finding]:
    import numpy as np

    offsets, marks = _array(cp, "d2t"), _array(cp, "t2d") != 0
    limit = vocab if vocab is not None else len(marks)
    index = np.arange(len(offsets), dtype=np.int64)
    # compared, never summed: a crafted offset near the integer type's end cannot wrap around
    rising = bool(np.all(offsets[1:] >= offsets[:-1]))  # i + d2t[i] < i + 1 + d2t[i + 1]
    inside = bool(np.all((offsets >= -index) & (offsets < limit - index)))
    found = []
    if not rising:
        found.append(Finding("d2t", Status.FAIL, "target ids i + d2t[i] not strictly increasing"))
    if not inside:
        found.append(Finding("d2t", Status.FAIL, f"target ids i + d2t[i] outside 0..{limit - 1}"))
    if draft is not None and vocab is not None and draft < vocab and not offsets.any():
        found.append(
            Finding(
                "d2t",
                Status.FAIL,
                "all zero while the draft vocabulary is smaller: draft id i is mapped to "
                "target id i (a table never filled)",
            )
        )
    count = int(marks.sum())
    if count != len(offsets):
        found.append(
            Finding("t2d", Status.FAIL, f"marks {count} target ids, not {len(offsets)} (d2t)")
        )
    elif rising and inside and limit <= len(marks):
        unmarked = int((~marks[index + offsets.astype(np.int64)]).sum())
        if unmarked:
            found.append(
                Finding("t2d", Status.FAIL, f"does not mark {unmarked} of d2t's target ids")
            )
    if not found:
        found.append(
            Finding(
                "d2t",
                Status.PASS,
                f"{len(offsets)} draft ids map to strictly increasing target ids below "
                f"{limit}; t2d marks exactly those",
            )
        )
    return found


def vocab_check(cp: Checkpoint, kind: DrafterKind, cfg: DrafterConfig) -> CheckResult | None:
    """The maps: both or neither, lengths, and the ids they give; None for a kind without."""
    if not kind.vocab_maps:
        return None
    held = [n for n in ("d2t", "t2d") if n in cp.tensors]
    if not held:
        return _absent(cfg.draft_vocab, cfg.vocab)
    if len(held) == 1:
        lost = "t2d" if held == ["d2t"] else "d2t"
        return _result(
            Finding(lost, Status.FAIL, f"absent while {held[0]} is stored: both or neither")
        )
    bad = _shape_findings(cp, cfg.draft_vocab, cfg.vocab)
    if bad:
        return _result(*bad)
    if isinstance(cp, HeadersOnly) and cp.why_no_bytes:
        return _result(Finding("d2t", Status.SKIP, f"values not read: {cp.why_no_bytes}"))
    return _result(*_map_findings(cp, cfg.draft_vocab, cfg.vocab))
