"""``mtpcheck accept``: offline, teacher-forced MTP acceptance per workload.

One main-model forward pass per sequence gives, at every position, the main model's hidden
state (after its final norm) and its next-token distribution. The MTP head then drafts, for
every position t at once, token t+2 from hidden state t and the embedding of token t+1; the
draft is scored against the main model's distribution at t+1 (k = 1). With D MTP layers the
chain is scored too: depth j drafts token t+j+1 from depth j-1's state, against the main
model's distribution at t+j (k = D, :class:`~mtpcheck.accept.head.MtpChain`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mtpcheck.accept.copies import copies_finding
from mtpcheck.accept.device_map import resolve_device_map
from mtpcheck.accept.gating import chain_result, describe_delta, finding, result
from mtpcheck.accept.head import HeadLayout, drafter_layouts
from mtpcheck.accept.inputs import Inputs, open_inputs
from mtpcheck.accept.loading import Drafter, load_drafter, resolve_device
from mtpcheck.accept.metrics import SequenceCounts, paired_difference
from mtpcheck.accept.online import measure_online
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.report import compared_finding, input_summaries, workload_checks
from mtpcheck.accept.scoring import measure
from mtpcheck.errors import MtpcheckError
from mtpcheck.families import ChainHidden
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    Checkpoint,
    Finding,
    OnlineAcceptance,
    Report,
)
from mtpcheck.model.modes import DraftRule, OnlineEngine
from mtpcheck.ticker import Ticker


@dataclass(frozen=True)
class _Measured:
    """What the checkpoints' passes gathered, reference checkpoint first."""

    counts: list[dict[str, list[SequenceCounts]]] = field(default_factory=list)
    """Per checkpoint: the depth-1 counters of each workload, per sequence."""
    results: list[AcceptanceResult] = field(default_factory=list)
    online: list[OnlineAcceptance] = field(default_factory=list)


def run_accept(options: AcceptOptions, log: Callable[[str], None] = lambda _: None) -> Report:
    """Measure every workload on the checkpoint (and the compared one); build the report."""
    if options.temperature < 0:
        raise MtpcheckError("--temperature must be >= 0")
    if options.engine == "vllm":
        from mtpcheck.accept.engine_runner import run_engine_accept

        return run_engine_accept(options, log)
    device = resolve_device(options.device)
    device_map = resolve_device_map(options.device_map)
    inputs = open_inputs(options)
    ckpts, analyses = inputs.checkpoints, inputs.analyses
    chain = ChainHidden(options.chain) if options.chain else None
    layouts = [drafter_layouts(c, a, chain) for c, a in zip(ckpts, analyses, strict=True)]

    measured = _Measured()
    for ckpt, layout, label in zip(ckpts, layouts, inputs.labels, strict=False):
        drafter = None
        if isinstance(layout, str):
            log(f"{label}{ckpt.path}: no drafter ({layout})")
        else:
            drafter = _load(ckpt, layout, label, device, device_map, options, log)
        note = layout if isinstance(layout, str) else ""
        _measure_checkpoint(drafter, ckpt.path, note, label, inputs, options, measured, log)
        del drafter

    deltas = _deltas(inputs, measured.counts)
    served = [f for c, a in zip(ckpts, analyses, strict=True) for f in copies_finding(c, a)]
    declared = {c.path: a.declared.value for c, a in zip(ckpts, analyses, strict=True)}
    findings = {
        w.name: _workload_findings(w.name, measured.results, deltas, declared, options)
        for w in inputs.workloads
    }
    return Report(
        command="accept",
        inputs=input_summaries(inputs),
        checks=workload_checks(inputs, "MTP acceptance", findings, served),
        acceptance=tuple(measured.results),
        acceptance_deltas=tuple(deltas),
        online=tuple(measured.online),
    )


def _load(
    ckpt: Checkpoint,
    layout: tuple[HeadLayout, ...],
    label: str,
    device: torch.device,
    device_map: str | dict[str, Any] | None,
    options: AcceptOptions,
    log: Callable[[str], None],
) -> Drafter:
    """The main model and the MTP layers ``--depths`` chains (fewer where the online engine
    rule reuses the layers for deeper drafts)."""
    started = time.monotonic()
    chained = options.depths
    reuses = options.online and options.draft_rule == DraftRule.ENGINE
    if reuses and options.online_engine == OnlineEngine.MTPCHECK and chained is not None:
        chained = min(chained, len(layout))  # deeper online drafts reuse the layers
    drafter = load_drafter(ckpt, layout, device, options.dtype, chained, device_map)
    seconds = time.monotonic() - started
    depths = drafter.chain.depths
    loaded = (
        f"{depths} MTP layers chained ({drafter.chain.chain_hidden.value} hidden state)"
        if depths > 1
        else "MTP head"
    )
    log(f"{label}{ckpt.path}: model and {loaded} loaded in {seconds:.1f} s")
    return drafter


def _measure_checkpoint(
    drafter: Drafter | None,
    path: str,
    note: str,
    label: str,
    inputs: Inputs,
    options: AcceptOptions,
    measured: _Measured,
    log: Callable[[str], None],
) -> None:
    """Every workload on one checkpoint (all zeros without a drafter; ``note`` says why):
    the teacher-forced figures and, with ``--online``, the draft-then-verify loop's."""
    per_workload = {}
    for workload in inputs.workloads:
        positions = sum(max(0, len(ids) - 1) for ids in workload.sequences)
        ticker = (
            Ticker(f"{label}scoring {workload.name}", positions, log, unit="tokens")
            if drafter is not None
            else None
        )
        counts, chained = measure(drafter, workload, options.temperature, ticker)
        per_workload[workload.name] = counts
        chain = (
            chain_result(chained, drafter.chain.chain_hidden)
            if chained and drafter is not None
            else None
        )
        measured.results.append(result(path, workload, counts, options.temperature, note, chain))
        if options.online and drafter is not None:
            started = time.monotonic()
            measured.online.append(measure_online(drafter, workload, options, path))
            log(
                f"{label}{workload.name}: online draft-then-verify, {measured.online[-1].drafts} "
                f"drafts in {time.monotonic() - started:.1f} s"
            )
    measured.counts.append(per_workload)


def _deltas(inputs: Inputs, counts: list[dict[str, list[SequenceCounts]]]) -> list[AcceptanceDelta]:
    """``--compare``: B - A per workload, paired over sequences."""
    if len(inputs.checkpoints) != 2:
        return []
    deltas = []
    for workload in inputs.workloads:
        a, b = (c[workload.name] for c in counts)
        greedy, alpha = paired_difference(a, b)
        deltas.append(AcceptanceDelta(workload.name, greedy, alpha, tokens_per_pass=alpha.value))
    return deltas


def _workload_findings(
    workload: str,
    results: list[AcceptanceResult],
    deltas: list[AcceptanceDelta],
    declared: dict[str, int | None],
    options: AcceptOptions,
) -> list[Finding]:
    """One workload's findings: each checkpoint's figures against ``--min-acceptance``, then
    B - A."""
    findings = [
        finding(r, options.min_acceptance, declared.get(r.checkpoint))
        for r in results
        if r.workload == workload
    ]
    findings += [
        compared_finding(describe_delta(d), {"alpha": d.alpha.value, "greedy": d.greedy.value})
        for d in deltas
        if d.workload == workload
    ]
    return findings
