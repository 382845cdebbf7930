"""HF against GGUF in a diff: the HF side under llama.cpp's names, the tensors the GGUF file
holds in a type that does not keep the source's values, and what the converter does."""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.checks.findings import comparison_finding, describe
from mtpcheck.checks.gguf_pairs import GGUF_FORMAT, NotMeasured, lossy_pairs, steps_off
from mtpcheck.errors import InputError
from mtpcheck.mapping.gguf_names import arch_for, outside_gguf
from mtpcheck.mapping.gguf_view import as_gguf
from mtpcheck.model import Checkpoint, Finding, Naming, Status, TensorComparison


def align_gguf(a: Checkpoint, b: Checkpoint) -> tuple[Checkpoint, Checkpoint, tuple[str, ...]]:
    """The HF side shown as the GGUF file llama.cpp's converter writes from it."""
    gguf, other = (a, b) if a.naming is Naming.GGUF else (b, a)
    if other.naming is not Naming.HF:
        raise InputError(
            gguf.path,
            f"is a GGUF file; it is compared with the HF checkpoint it was converted from, "
            f"not with the {other.naming.value} checkpoint {other.path}",
        )
    view = as_gguf(other, gguf)
    outside = (*view.plan.unmapped, *outside_gguf(gguf.tensors))
    return (view, b, outside) if other is a else (a, view, outside)


def lossy_findings(
    a: Checkpoint, b: Checkpoint, names: set[str], dequantize: bool, steps_allowed: float
) -> tuple[list[tuple[Finding, TensorComparison]], set[str]]:
    """HF against GGUF: the tensors B holds in a type that does not keep A's values, each
    dequantized and measured with ``dequantize``."""
    found, covered = lossy_pairs(a, b, names)
    measured: list[tuple[Finding, TensorComparison]] = []
    for c in found:
        if not dequantize:
            measured.append((comparison_finding(c), c))
            continue
        full, stored = (a, b) if b.format == GGUF_FORMAT else (b, a)
        try:
            steps = steps_off(full, stored, c.name)
        except NotMeasured as e:
            note = Finding(c.name, Status.INFO, f"{describe(c)}; not dequantized: {e}")
            measured.append((note, c))
            continue
        done = replace(c, steps=steps)
        status = Status.PASS if steps <= steps_allowed else Status.FAIL
        why = "" if status is Status.PASS else ": the stored values are not the source's"
        measured.append((Finding(c.name, status, describe(done) + why, {"steps": steps}), done))
    return measured, covered


def converter_notes(a: Checkpoint, b: Checkpoint) -> tuple[Finding, ...]:
    """Across HF and GGUF: which converter's names were used, and an MTP layer it drops."""
    view = next((c for c in (a, b) if isinstance(c.config.get("converter"), str)), None)
    if view is None:
        return ()
    arch = arch_for(view.config)
    notes = [
        Finding(
            "llama.cpp names",
            Status.INFO,
            f"HF tensors named and laid out as {view.config['converter']} writes them",
        )
    ]
    if arch is not None and not arch.exports_mtp and view.config.get("nextn_predict_layers"):
        notes.append(
            Finding(
                "llama.cpp MTP export",
                Status.INFO,
                f"this converter writes {arch.arch} without its MTP layer (--mtp is not "
                f"supported for {arch.hf_architectures[0]}): the MTP tensors cannot be in B",
            )
        )
    return tuple(notes)
