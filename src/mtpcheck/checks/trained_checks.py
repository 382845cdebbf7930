"""Was the MTP layer trained, or only initialised?

A layer that is present, complete and declared can still be worthless: written from a fresh
initialisation (a loader that ignored the stored MTP tensors, a converter told no MTP count)
or copied from a main layer. Three signs, each read from a bounded number of bytes:

* **norms at their initial value**: every element of a norm weight exactly 1.0 (RMSNorm as
  transformers' ``_init_weights`` and megatron-core build it) or exactly 0.0 (zero-centred
  norms). Training never leaves a whole norm vector on one value. Every norm of a layer so:
  FAIL; some of them: WARN. Norms are read whole (``hidden_size`` elements each).
* **a copy of a main layer**: an MTP block tensor byte-identical to the same tensor of a main
  decoder layer. FAIL. The first :data:`PREFIX_BYTES` of each candidate pair are compared
  first; only an equal prefix leads to the whole tensor.
* **projections with an initialiser's statistics**: a sample (the first :data:`SAMPLE_BYTES`
  of each tensor) whose mean is about 0 and whose standard deviation is the configured
  initialiser's (``initializer_range``, megatron-core's ``init_method_std``, or its output
  layers' ``std / sqrt(2 * num_layers)``) within sampling error, where the main layers' same
  tensors are not: WARN, since statistics can mislead. Where the main layers look like an
  initialisation too (a synthetic checkpoint), nothing can be told and nothing is said.

Routed experts past the first are skipped by the last two (they are many and alike): at
DeepSeek-V3 scale (61 main layers) about 10 MB are read (computed from its shapes).
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtpcheck.checks.tensor_match import compare
from mtpcheck.dtypes import itemsize, unpack_floats
from mtpcheck.families import MtpAnalysis
from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    HeadersOnly,
    Status,
    TensorStatus,
)
from mtpcheck.model.config_keys import TEXT_ROOTS, lookup
from mtpcheck.params import Role, logical_name, quantized_modules
from mtpcheck.units import first_few

PREFIX_BYTES = 4096
SAMPLE_BYTES = 256 * 1024
MIN_SAMPLE = 1024
"""Fewer elements say too little about a distribution to be judged."""
_FLOATS = ("BF16", "F16", "F32")
_LATER_EXPERT = ".experts."
_OUTPUT_LAYERS = ("o_proj.", "down_proj.", "out_proj.", "linear_proj.", "linear_fc2.")
"""Layers megatron-core initialises with its scaled output init."""


def trained_check(ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckResult:
    """The ``mtp-trained`` check of ``inspect`` (and of roundtrip's source stage)."""
    title = "MTP layers trained, not initialised"
    present = [layer for layer in analysis.layers if layer.present]
    if not present:
        return CheckResult(CheckName.MTP_TRAINED, title, (_skip("no MTP layers present"),))
    no_bytes = ckpt.why_no_bytes if isinstance(ckpt, HeadersOnly) else ""
    if no_bytes:
        return CheckResult(CheckName.MTP_TRAINED, title, (_skip(f"not judged: {no_bytes}"),))
    copies = {c for c, _ in analysis.copies}
    stds = init_stds(ckpt.config)
    mains = _main_prefixes(analysis)
    findings = []
    for layer in present:
        names = [n for n in layer.present if n not in copies and ckpt.tensors[n].readable]
        findings += _layer_findings(ckpt, analysis, layer.index, names, mains, stds)
    return CheckResult(CheckName.MTP_TRAINED, title, tuple(findings))


def _skip(message: str) -> Finding:
    return Finding("mtp-trained", Status.SKIP, message)


def _layer_findings(
    ckpt: Checkpoint,
    analysis: MtpAnalysis,
    index: int,
    names: Sequence[str],
    mains: Sequence[str],
    stds: Sequence[float],
) -> list[Finding]:
    subject = f"mtp layer {index}"
    norms = [n for n in names if _is_norm(ckpt, n)]
    initial = {n: v for n in norms if (v := _initial_value(ckpt, n)) is not None}
    at_init = list(initial)
    out = []
    if norms and len(at_init) == len(norms):
        values = sorted({str(v) for v in initial.values()})
        out.append(
            Finding(
                subject,
                Status.FAIL,
                f"all {len(norms)} norms hold their initial value ({' or '.join(values)} in "
                f"every element: {first_few(at_init, 3, counted=False)}): the layer was "
                "initialised, not trained",
                {"norms_at_init": at_init},
            )
        )
    elif at_init:
        out.append(
            Finding(
                subject,
                Status.WARN,
                f"{len(at_init)} of {len(norms)} norms hold their initial value in every "
                f"element ({first_few(at_init, 3, counted=False)})",
                {"norms_at_init": at_init},
            )
        )
    blocks = [(p, m) for p, m in analysis.mirrors if any(n.startswith(p) for n in names)]
    copied = _copied(ckpt, names, blocks, mains, analysis.mtp_names)
    if copied:
        out.append(
            Finding(
                subject,
                Status.FAIL,
                f"{len(copied)} block tensor(s) byte-identical to a main layer's "
                f"({first_few([f'{n} = {m}' for n, m in copied], 3, counted=False)}): copied, "
                "not trained",
                {"copied_from": dict(copied)},
            )
        )
    fresh, reference = _fresh_statistics(ckpt, names, blocks, stds)
    if fresh:
        out.append(
            Finding(
                subject,
                Status.WARN,
                f"{len(fresh)} projection(s) have the statistics of a fresh initialisation "
                f"({first_few(fresh, 3, counted=False)}: mean ~0, std {_fmt(stds)}), unlike the "
                f"main layers' ({reference})",
                {"initialised_like": fresh},
            )
        )
    if not out:
        checked = f"{len(norms)} norms" + (f", {len(blocks)} block(s)" if blocks else "")
        out.append(Finding(subject, Status.PASS, f"looks trained ({checked} checked)"))
    return out


def _is_norm(ckpt: Checkpoint, name: str) -> bool:
    meta = ckpt.tensors[name]
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
    return len(meta.shape) == 1 and meta.dtype in _FLOATS and "norm" in leaf


_ONE = {
    "BF16": struct.pack("<H", 0x3F80),
    "F16": struct.pack("<e", 1.0),
    "F32": struct.pack("<f", 1.0),
}
"""1.0 in each float type's bytes (0.0 is all zero bytes in each)."""


def _initial_value(ckpt: Checkpoint, name: str) -> float | None:
    """1.0 or 0.0 when every element of the tensor is exactly that, else None (bytes
    compared: -0.0 is not 0.0)."""
    meta = ckpt.tensors[name]
    data = _head(ckpt, name, meta.nbytes)
    count = meta.nbytes // (itemsize(meta.dtype) or 1)
    if not count or len(data) != meta.nbytes:
        return None
    one = _ONE[meta.dtype]
    if data == one * count:
        return 1.0
    if data == bytes(len(data)):
        return 0.0
    return None


def _head(ckpt: Checkpoint, name: str, limit: int) -> bytes:
    """The first ``limit`` bytes of a tensor (whole elements)."""
    width = itemsize(ckpt.tensors[name].dtype) or 1
    limit -= limit % width
    data = bytearray()
    for chunk in ckpt.read_chunks(name, min(limit, 1 << 20) or width):
        data += chunk[: limit - len(data)]
        if len(data) >= limit:
            break
    return bytes(data)


def _main_prefixes(analysis: MtpAnalysis) -> list[str]:
    family, hidden = analysis.family, analysis.num_hidden_layers
    if family is None or hidden is None:
        return sorted({m for _, m in analysis.mirrors})
    main = NameTemplate(family.layout.main_layer_prefix)
    return [main.main_layer(k) for k in range(hidden)]


def _block_tensors(
    ckpt: Checkpoint, names: Sequence[str], blocks: Sequence[tuple[str, str]]
) -> Iterator[tuple[str, str, str]]:
    """(MTP name, its block prefix, relative name) of the block's multi-row float tensors,
    routed experts past the first left out, and so are the side parts of a quantized weight
    (its scales: equal scales are a coincidence of quantization, not a copied tensor)."""
    packed = quantized_modules(names)
    for prefix, _ in blocks:
        for name in names:
            if not name.startswith(prefix):
                continue
            rel = name[len(prefix) :]
            meta = ckpt.tensors[name]
            if len(meta.shape) < 2 or meta.dtype not in _FLOATS or _later_expert(rel):
                continue
            if logical_name(name, packed)[1] not in (Role.WEIGHT, Role.PACKED):
                continue
            yield name, prefix, rel


def _later_expert(rel: str) -> bool:
    head, found, tail = rel.partition(_LATER_EXPERT)
    if not found:
        return False
    index = tail.split(".", 1)[0]
    if index == "local_experts":
        index = tail.split(".", 2)[1]
    return index.isdigit() and index != "0"


def _copied(
    ckpt: Checkpoint,
    names: Sequence[str],
    blocks: Sequence[tuple[str, str]],
    mains: Sequence[str],
    mtp: frozenset[str],
) -> list[tuple[str, str]]:
    found = []
    for name, _, rel in _block_tensors(ckpt, names, blocks):
        mine = ckpt.tensors[name]
        head = _head(ckpt, name, PREFIX_BYTES)
        for main_prefix in mains:
            other = main_prefix + rel
            if other in mtp:  # an MTP layer counted among the main ones (Ling-V2)
                continue
            meta = ckpt.tensors.get(other)
            if meta is None or not meta.readable or meta.dtype != mine.dtype:
                continue
            if meta.shape != mine.shape or _head(ckpt, other, PREFIX_BYTES) != head:
                continue  # the bytes are compared only where the first ones agree
            if compare(ckpt, name, ckpt, other).status is TensorStatus.EQUAL:
                found.append((name, other))
                break
    return found


def init_stds(config: Mapping[str, Any]) -> list[float]:
    """Standard deviations the config's initialiser draws projections with."""
    found = []
    for key in ("initializer_range", "init_method_std"):
        for root in TEXT_ROOTS:
            value = lookup(config, root + key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                found.append(float(value))
    layers = config.get("num_layers")
    if "init_method_std" in config and isinstance(layers, int) and layers > 0:
        found += [s / math.sqrt(2 * layers) for s in list(found)]
    return sorted(set(found))


@dataclass(frozen=True)
class _Stats:
    mean: float
    std: float
    n: int

    def initialised(self, stds: Sequence[float]) -> bool:
        """Mean ~0 and std one of ``stds``, each within four standard errors."""
        tolerance = max(0.03, 4 / math.sqrt(2 * self.n))
        return any(
            abs(self.std / s - 1) < tolerance and abs(self.mean) < 4 * s / math.sqrt(self.n)
            for s in stds
        )


def _stats(ckpt: Checkpoint, name: str) -> _Stats | None:
    values = unpack_floats(_head(ckpt, name, SAMPLE_BYTES), ckpt.tensors[name].dtype)
    n = len(values)
    if n < MIN_SAMPLE:
        return None
    total = math.fsum(values)
    if not math.isfinite(total):
        return None
    mean = total / n
    square = math.fsum(map(operator.mul, values, values)) / n  # no Python frame per value
    return _Stats(mean, math.sqrt(max(0.0, square - mean * mean)), n)


def _fresh_statistics(
    ckpt: Checkpoint,
    names: Sequence[str],
    blocks: Sequence[tuple[str, str]],
    stds: Sequence[float],
) -> tuple[list[str], str]:
    """MTP tensors drawn like the initialiser, when the main layers' same tensors are not
    (most of them); with the main layers' standard deviations, in words."""
    if not stds or not blocks:
        return [], ""
    mirrored = dict(blocks)
    in_blocks = list(_block_tensors(ckpt, names, blocks))
    fresh, own, trained, judged, main_stds = [], [], 0, 0, []
    for name, prefix, rel in in_blocks:
        other = ckpt.tensors.get(mirrored[prefix] + rel)
        if other is None:  # MTP-only (eh_proj inside a block prefix): judged below
            own.append(name)
            continue
        mine = _stats(ckpt, name)
        comparable = other.readable and other.dtype in _FLOATS
        theirs = _stats(ckpt, mirrored[prefix] + rel) if comparable else None
        if mine is None or theirs is None:
            continue
        judged += 1
        if not theirs.initialised(stds):
            trained += 1
            main_stds.append(theirs.std)
        if mine.initialised(stds):
            fresh.append(name)
    if judged == 0 or trained * 2 <= judged:
        return [], ""
    # outside the blocks (Qwen3-Next's mtp.fc): a block's own tensors were sorted above, and
    # the ones it leaves out (routed experts past the first) stay out
    prefixes = tuple(mirrored)
    own += [n for n in names if not n.startswith(prefixes) and len(ckpt.tensors[n].shape) == 2]
    for name in own:  # the MTP-only projection (eh_proj, fc): no main counterpart
        if ckpt.tensors[name].dtype in _FLOATS:
            mine = _stats(ckpt, name)
            if mine is not None and mine.initialised(stds):
                fresh.append(name)
    return fresh, f"std {min(main_stds):.3g} to {max(main_stds):.3g}"


def _fmt(stds: Sequence[float]) -> str:
    return " or ".join(f"{s:.3g}" for s in stds)
