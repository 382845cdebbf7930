"""A target that keeps a DSpark drafter under ``mtp.*`` (DeepSeek-V4-Flash-0731, V4.1: their
configs carry ``dspark_block_size``, ``dspark_target_layer_ids``, ``dspark_markov_rank``).

Those tensors are a block drafter, not MTP layers: they lack ``enorm`` / ``hnorm`` /
``eh_proj`` by design, so the MTP checks would call them incomplete. They are named as a
DSpark drafter and never counted as MTP layers; a config that also declares MTP layers is
warned about, for vLLM's ``method=mtp`` may half-load the drafter (vllm#41834).
"""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families import MtpAnalysis
from mtpcheck.model import CheckName, CheckResult, Finding, Status, TensorMeta
from mtpcheck.units import first_few

_PREFIX = "mtp."


def without_mtp_layers(analysis: MtpAnalysis) -> MtpAnalysis:
    """``analysis`` with no MTP layer found: what ``mtp.*`` holds is judged elsewhere."""
    return replace(analysis, layers=(), copies=(), reference_layers={}, mirrors=())


def dspark_count_check(
    analysis: MtpAnalysis, keys: tuple[str, ...], tensors: dict[str, TensorMeta]
) -> CheckResult:
    """The ``mtp-count`` check of such a target: the drafter named, nothing counted."""
    held = [n for n in tensors if n.startswith(_PREFIX)]
    said = f"its config names a DSpark drafter ({first_few(list(keys), 3)})"
    if not held:
        finding = Finding(
            "mtp-count", Status.FAIL, f"{said} but the checkpoint holds no mtp.* tensors"
        )
    elif analysis.declared.value:
        finding = Finding(
            "mtp-count",
            Status.WARN,
            f"{said}, held in {len(held)} mtp.* tensors, and also declares "
            f"{analysis.declared.value} MTP layer(s) ({analysis.declared.source}): an engine "
            "told method=mtp may half-load the drafter as an MTP layer (vllm#41834)",
        )
    else:
        finding = Finding(
            "mtp-count",
            Status.PASS,
            f"{said}, held in {len(held)} mtp.* tensors: a DSpark drafter, not MTP layers, "
            "so none is counted",
        )
    return CheckResult(CheckName.MTP_COUNT, "Declared vs present MTP layers", (finding,))
