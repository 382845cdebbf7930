"""Pair a parameter stored plainly on one side of a diff with its quantized form on the other,
so that a quantized tensor is reported as quantized, not as one missing and several extra."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mtpcheck.model import TensorComparison, TensorMeta, TensorStatus
from mtpcheck.params import FUSED_EXPERTS, LogicalParam, Scheme, group, stored_forms
from mtpcheck.params.storage import storage_of


def _form(param: LogicalParam, tensors: Mapping[str, TensorMeta]) -> tuple[object, ...]:
    """What must match for the two sides to be compared tensor by tensor, bit for bit."""
    return tuple((role, name.rpartition(".")[2], tensors[name].dtype) for role, name in param.parts)


@dataclass(frozen=True)
class QuantizedPair:
    """One parameter held in different forms by the two sides of a diff."""

    comparison: TensorComparison
    a: LogicalParam
    b: LogicalParam
    slices: tuple[tuple[LogicalParam, int, int, int], ...] = ()
    """Where B unpacks A's fused experts: (B's parameter, expert, first row, row past the
    last) of A's fused tensor that each of B's per-expert parameters holds."""


def quantized_pairs(
    a: Mapping[str, TensorMeta],
    b: Mapping[str, TensorMeta],
    names: Collection[str],
    scheme_a: Scheme,
    scheme_b: Scheme,
) -> tuple[list[QuantizedPair], set[str]]:
    """The parameters among ``names`` that both sides hold in different forms, one of them
    quantized (each with its QUANTIZED comparison); and the stored names they account for."""
    ga = group(n for n in names if n in a)
    gb = group(n for n in names if n in b)
    found: list[QuantizedPair] = []
    covered: set[str] = set()
    for logical in sorted(ga.keys() & gb.keys()):
        pa, pb = ga[logical], gb[logical]
        if not (pa.quantized(a) or pb.quantized(b)) or _form(pa, a) == _form(pb, b):
            continue  # the same form on both sides: compared bit for bit, part by part
        va, vb = pa.values, pb.values
        if va is None or vb is None:
            continue  # one side holds side parts only: reported tensor by tensor
        sa, sb = storage_of(pa, a, scheme_a), storage_of(pb, b, scheme_b)
        comparison = TensorComparison(
            name=logical,
            status=TensorStatus.QUANTIZED,
            dtype=(a[va].dtype, b[vb].dtype),
            shape=(a[va].shape, b[vb].shape),
            nbytes=sum(b[n].nbytes for n in pb.stored),
            storage=(_words(sa.label, sa.detail), _words(sb.label, sb.detail)),
        )
        found.append(QuantizedPair(comparison, pa, pb))
        covered |= set(pa.stored) | set(pb.stored)
    for pair in _unfused(a, b, ga, gb, scheme_b):
        found.append(pair)
        covered |= {pair.a.name, *(n for p, *_ in pair.slices for n in p.stored)}
    return found, covered


def _unfused(
    a: Mapping[str, TensorMeta],
    b: Mapping[str, TensorMeta],
    ga: Mapping[str, LogicalParam],
    gb: Mapping[str, LogicalParam],
    scheme_b: Scheme,
) -> list[QuantizedPair]:
    """A's fused experts (``mlp.experts.gate_up_proj`` [E, 2I, H]) that B stores quantized
    one parameter per expert and projection (llm-compressor's model_free_ptq unpacks them)."""
    found = []
    for name, param in ga.items():
        fused = next((f for f in FUSED_EXPERTS if name.endswith(f)), None)
        if fused is None or name in gb or len(a[name].shape) != 3:
            continue
        root = name[: -len(fused)] + "mlp.experts."
        count = a[name].shape[0]
        slices = []
        for e in range(count):
            start = 0
            for proj in FUSED_EXPERTS[fused]:
                part = gb.get(f"{root}{e}.{proj}.weight")
                values = part.values if part is not None else None
                if part is None or values is None:
                    break
                stop = start + b[values].shape[0]
                slices.append((part, e, start, stop))
                start = stop
        if len(slices) != count * len(FUSED_EXPERTS[fused]):
            continue
        if not any(p.quantized(b) for p, *_ in slices):
            continue
        first = slices[0][0]
        storage = storage_of(first, b, scheme_b)
        projections = " + ".join(FUSED_EXPERTS[fused])
        comparison = TensorComparison(
            name=name,
            status=TensorStatus.QUANTIZED,
            dtype=(a[name].dtype, b[first.values or ""].dtype),
            shape=(a[name].shape, b[first.values or ""].shape),
            nbytes=sum(b[n].nbytes for p, *_ in slices for n in p.stored),
            storage=(
                f"{a[name].dtype}, {count} experts fused",
                f"{storage.label}, one {projections} per expert",
            ),
        )
        found.append(QuantizedPair(comparison, param, first, tuple(slices)))
    return found


def _words(label: str, detail: str) -> str:
    return f"{label}: {detail}" if detail and " + " in detail else label


def quantized_copy(
    tensors: Mapping[str, TensorMeta], main: str, copy: str, scheme: Scheme
) -> str | None:
    """Why the stored copy ``copy`` of ``main`` is not compared bit for bit: one of the two
    is quantized and they are stored differently (a release that quantizes the MTP layer's
    copy of the head ships it so); None when they are to be compared."""
    held = group(n for name in (main, copy) for n in stored_forms(name) if n in tensors)
    pm, pc = held.get(main), held.get(copy)
    if pm is None or pc is None or _form(pm, tensors) == _form(pc, tensors):
        return None
    if not (pm.quantized(tensors) or pc.quantized(tensors)):
        return None
    sm, sc = storage_of(pm, tensors, scheme), storage_of(pc, tensors, scheme)
    return (
        f"a quantized copy: stored {_words(sc.label, sc.detail)}, {main} "
        f"{_words(sm.label, sm.detail)}; not comparable bit for bit"
    )
