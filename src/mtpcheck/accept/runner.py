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

from mtpcheck.accept.copies import COPIES_TITLE, copies_finding
from mtpcheck.accept.device_map import resolve_device_map
from mtpcheck.accept.gating import chain_result, describe_delta, finding, result
from mtpcheck.accept.head import (
    drafter_layouts,
)
from mtpcheck.accept.inputs import open_inputs
from mtpcheck.accept.loading import load_drafter, resolve_device
from mtpcheck.accept.metrics import (
    SequenceCounts,
    paired_difference,
)
from mtpcheck.accept.online import measure_online
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.scoring import measure
from mtpcheck.errors import MtpcheckError
from mtpcheck.families import ChainHidden, summarise
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    CheckResult,
    Finding,
    OnlineAcceptance,
    Report,
    Status,
)
from mtpcheck.ticker import Ticker


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
    ckpts, analyses, workloads = inputs.checkpoints, inputs.analyses, inputs.workloads
    chain = ChainHidden(options.chain) if options.chain else None
    layouts = [drafter_layouts(c, a, chain) for c, a in zip(ckpts, analyses, strict=True)]

    labels = inputs.labels
    all_counts: list[dict[str, list[SequenceCounts]]] = []
    results: list[AcceptanceResult] = []
    online: list[OnlineAcceptance] = []
    for ckpt, layout, label in zip(ckpts, layouts, labels, strict=False):
        note = layout if isinstance(layout, str) else ""
        drafter = None
        if not isinstance(layout, str):
            started = time.monotonic()
            chained = options.depths
            reuses = options.online and options.draft_rule == "engine"
            if reuses and options.online_engine == "mtpcheck" and chained is not None:
                chained = min(chained, len(layout))  # deeper online drafts reuse the layers
            drafter = load_drafter(ckpt, layout, device, options.dtype, chained, device_map)
            seconds = time.monotonic() - started
            depths = drafter.chain.depths
            chained = (
                f"{depths} MTP layers chained ({drafter.chain.chain_hidden.value} hidden state)"
                if depths > 1
                else "MTP head"
            )
            log(f"{label}{ckpt.path}: model and {chained} loaded in {seconds:.1f} s")
        else:
            log(f"{label}{ckpt.path}: no drafter ({note})")
        per_workload = {}
        for workload in workloads:
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
            results.append(result(ckpt.path, workload, counts, options.temperature, note, chain))
            if options.online and drafter is not None:
                started = time.monotonic()
                online.append(measure_online(drafter, workload, options, ckpt.path))
                log(
                    f"{label}{workload.name}: online draft-then-verify, {online[-1].drafts} "
                    f"drafts in {time.monotonic() - started:.1f} s"
                )
        all_counts.append(per_workload)
        del drafter

    deltas: list[AcceptanceDelta] = []
    if len(ckpts) == 2:
        for workload in workloads:
            a, b = (c[workload.name] for c in all_counts)
            greedy, alpha = paired_difference(a, b)
            deltas.append(
                AcceptanceDelta(workload.name, greedy, alpha, tokens_per_pass=alpha.value)
            )

    served = [f for c, a in zip(ckpts, analyses, strict=True) for f in copies_finding(c, a)]
    checks = []
    for workload in workloads:
        declared = {c.path: a.declared.value for c, a in zip(ckpts, analyses, strict=True)}
        findings = [
            finding(r, options.min_acceptance, declared.get(r.checkpoint))
            for r in results
            if r.workload == workload.name
        ]
        findings += [
            Finding(
                "B - A",
                Status.INFO,
                describe_delta(d),
                {"alpha": d.alpha.value, "greedy": d.greedy.value},
            )
            for d in deltas
            if d.workload == workload.name
        ]
        checks.append(
            CheckResult(
                f"acceptance/{workload.name}",
                f"MTP acceptance on workload {workload.name}",
                tuple(findings),
            )
        )
    if served:
        checks.append(CheckResult("served-copies", COPIES_TITLE, tuple(served)))
    return Report(
        command="accept",
        inputs=tuple(summarise(c, a) for c, a in zip(ckpts, analyses, strict=True)),
        checks=tuple(checks),
        acceptance=tuple(results),
        acceptance_deltas=tuple(deltas),
        online=tuple(online),
    )
