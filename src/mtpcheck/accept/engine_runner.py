"""``accept --engine vllm``: acceptance per workload as the serving engine itself measures it.

Each checkpoint is started once in vLLM (:mod:`mtpcheck.accept.vllm_engine`) with every
workload's prompts (each sequence's first ``--prompt-tokens`` ids, tokenised by mtpcheck, so
both checkpoints of ``--compare`` see the same ids); per workload the figures are vLLM's
per-request counts, which add up to its global counters (checked). With ``--teacher-forced``
mtpcheck also loads the checkpoint through transformers and scores the engine's own output at
the very positions the engine drafted, beside the engine's figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from mtpcheck.accept.copies import copies_finding
from mtpcheck.accept.drafter import Drafter as SeparateDrafter
from mtpcheck.accept.gating import no_drafter_status
from mtpcheck.accept.head import drafter_layouts, missing_drafter
from mtpcheck.accept.inputs import Inputs, open_inputs
from mtpcheck.accept.loading import Drafter, load_drafter, resolve_device
from mtpcheck.accept.online import teacher_forced_at
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.report import compared_finding, input_summaries, workload_checks
from mtpcheck.accept.stats import paired_ratio_difference, ratio_estimate, shown
from mtpcheck.accept.vllm_engine import EngineRequest, EngineRun, run_vllm
from mtpcheck.accept.workloads import Workload
from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.families import MtpAnalysis
from mtpcheck.model import (
    Checkpoint,
    EngineAcceptance,
    EngineDelta,
    Estimate,
    Finding,
    Report,
    Status,
)


def _prompts(workload: Workload, prompt_tokens: int) -> list[list[int]]:
    prompts = [list(s[:prompt_tokens]) for s in workload.sequences if len(s) >= 2]
    if not prompts:
        raise MtpcheckError(f"workload {workload.name}: no sequence has two tokens to start from")
    return prompts


def _passes(prompt: int, request: EngineRequest) -> list[int]:
    """The teacher-forced slot of each verify step: the first step drafts after the prefill's
    token (slot prompt - 1); each step moves on by its accepted drafts plus one."""
    slots, slot = [], prompt - 1
    for accepted in request.accepted_per_step:
        slots.append(slot)
        slot += accepted + 1
    return slots


def _acceptance(
    label: str,
    workload: Workload,
    requests: tuple[EngineRequest, ...],
    version: str,
    k: int,
    options: AcceptOptions,
) -> EngineAcceptance:
    steps = [r.steps for r in requests]
    reached = [[r.reached(i) for r in requests] for i in range(1, k + 1)]
    length = ratio_estimate([r.steps + r.accepted for r in requests], steps, bounds=(1.0, 1.0 + k))
    return EngineAcceptance(
        checkpoint=label,
        workload=workload.name,
        engine=f"vLLM {version}",
        k=k,
        temperature=options.temperature,
        requests=len(requests),
        prompt_tokens=options.prompt_tokens,
        new_tokens=options.new_tokens,
        generated_tokens=sum(len(r.generated) for r in requests),
        drafts=sum(steps),
        draft_tokens=sum(r.draft_tokens for r in requests),
        accepted_tokens=sum(r.accepted for r in requests),
        accepted_per_position=tuple(sum(counts) for counts in reached),
        by_position=tuple(ratio_estimate(counts, steps) for counts in reached),
        mean_acceptance_length=length,
        parallel=options.vllm.parallel,
    )


def _with_teacher_forced(
    result: EngineAcceptance,
    drafter: Drafter,
    prompts: list[list[int]],
    requests: tuple[EngineRequest, ...],
) -> EngineAcceptance:
    sequences = [p + list(r.generated) for p, r in zip(prompts, requests, strict=True)]
    passes = [
        (i, slot, accepted)
        for i, (p, r) in enumerate(zip(prompts, requests, strict=True))
        for slot, accepted in zip(_passes(len(p), r), r.accepted_per_step, strict=True)
    ]
    # vLLM drafts q's argmax by default (draft_sample_method "greedy")
    by_depth, leading = teacher_forced_at(
        drafter, sequences, passes, result.k, result.temperature, argmax_drafts=True
    )
    agreeing = None  # pass by pass only where the chain scores every drafted position
    if result.temperature == 0 and result.k <= drafter.chain.depths:
        agreeing = sum(t == a for t, (_, _, a) in zip(leading, passes, strict=True))
    return replace(result, teacher_forced=by_depth[: drafter.chain.depths], agreeing=agreeing)


def describe(e: EngineAcceptance) -> str:
    """The sentence an engine figure's finding says."""
    positions = " / ".join(shown(p) for p in e.by_position)
    tf = ""
    if e.teacher_forced:
        tf = "; teacher-forced at the same positions " + " / ".join(
            f"{v:.3f}" for v in e.teacher_forced
        )
        if e.agreeing is not None:
            tf += f" ({e.agreeing} of {e.drafts} steps agree)"
    return (
        f"{e.engine} ({e.parallel}), k={e.k}, T={e.temperature:g}: accepted per position "
        f"{positions}, mean acceptance length {shown(e.mean_acceptance_length, '.2f')}; "
        f"{e.drafts} steps in {e.requests} requests (95% CI over requests){tf}"
    )


def _finding(e: EngineAcceptance, min_acceptance: float | None) -> Finding:
    details = {
        "engine": e.engine,
        "k": e.k,
        "drafts": e.drafts,
        "accepted_per_position": list(e.accepted_per_position),
        "mean_acceptance_length": e.mean_acceptance_length.value,
    }
    first = e.by_position[0].value
    if min_acceptance is not None:
        details["min_acceptance"] = min_acceptance
        if first < min_acceptance:
            message = f"{describe(e)}; position 1 below --min-acceptance {min_acceptance:g}"
            return Finding(e.checkpoint, Status.FAIL, message, details)
    return Finding(e.checkpoint, Status.PASS, describe(e), details)


def _disagreement(e: EngineAcceptance) -> Finding | None:
    """WARN when the teacher-forced depth-1 figure at the engine's own positions lies outside
    the engine's 95% interval at position 1. Depth 1 drafts alike under every rule, so the
    engine then runs the MTP layer otherwise than the checkpoint defines it: copies it
    replaces, config keys it reads differently, or a defect of the engine."""
    first = e.by_position[0]
    if not e.teacher_forced or first.low is None or first.high is None:
        return None
    expected = e.teacher_forced[0]
    if first.low <= expected <= first.high:
        return None
    return Finding(
        e.checkpoint,
        Status.WARN,
        f"{e.engine} accepts {shown(first)} at position 1, teacher-forced at the same positions "
        f"{expected:.3f}: the engine does not draft as the checkpoint's MTP layer does (stored "
        "copies it replaces, config keys it reads otherwise, or an engine defect)",
        {"engine": first.value, "teacher_forced": expected},
    )


@dataclass(frozen=True)
class _Plan:
    """What every checkpoint's engine run is asked to do."""

    options: AcceptOptions
    workloads: tuple[Workload, ...]
    prompts: dict[str, list[list[int]]]
    """Per workload, its prompts (each sequence's first ``--prompt-tokens`` ids)."""
    k: int
    log: Callable[[str], None]
    drafter: SeparateDrafter | None = None
    """``--drafter``: vLLM drafts with this separate drafter, not the checkpoint's MTP."""


@dataclass(frozen=True)
class _Runs:
    """What the engine runs gathered, keyed by (checkpoint, workload) where per workload."""

    results: dict[tuple[str, str], EngineAcceptance] = field(default_factory=dict)
    requests: dict[tuple[str, str], tuple[EngineRequest, ...]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    """Per checkpoint without a drafter: why."""
    served: list[Finding] = field(default_factory=list)
    """The stored copies that differ from their main tensors."""


def run_engine_accept(
    options: AcceptOptions, log: Callable[[str], None] = lambda _: None
) -> Report:
    """Every workload through the engine, on the checkpoint (and the compared one)."""
    separate = _separate_drafter(options, log)
    inputs = open_inputs(options)
    prompts = {w.name: _prompts(w, options.prompt_tokens) for w in inputs.workloads}
    # one speculative config for both sides of --compare: the reference's, as it is served
    if separate is not None:
        k = options.depths or separate.speculative_tokens or 1
    else:
        k = options.depths or inputs.analyses[0].complete_layers or 1
    plan = _Plan(options, inputs.workloads, prompts, k, log, separate)
    runs = _Runs()
    for ckpt, analysis, directory, label in zip(
        inputs.checkpoints, inputs.analyses, inputs.directories, inputs.labels, strict=False
    ):
        _run_checkpoint(plan, runs, ckpt, analysis, directory, label)
    deltas = _deltas(inputs, runs, k)
    findings = {
        w.name: _workload_findings(w.name, inputs, runs, deltas, options.min_acceptance)
        for w in inputs.workloads
    }
    title = "MTP acceptance in vLLM"
    if separate is not None:
        findings = {name: _naming(fs, separate) for name, fs in findings.items()}
        title = f"{separate.title} acceptance in vLLM"
    drafter = "" if separate is None else separate.title
    return Report(
        command="accept",
        inputs=input_summaries(inputs),
        checks=workload_checks(inputs, title, findings, runs.served),
        engine=tuple(replace(e, drafter=drafter) for e in runs.results.values()),
        engine_deltas=tuple(deltas),
    )


def _separate_drafter(options: AcceptOptions, log: Callable[[str], None]) -> SeparateDrafter | None:
    """``--drafter``: the separate drafter vLLM drafts with, recognised before anything
    runs; what only a checkpoint's own MTP layers support is refused."""
    if options.drafter is None:
        return None
    from mtpcheck.accept.drafter import identify_drafter

    refused = {
        "--teacher-forced": options.teacher_forced,
        "--compare": options.compare is not None,
    }
    for flag, given in refused.items():
        if given:
            raise InputError(
                options.drafter,
                f"--drafter with {flag}: mtpcheck scores and compares a checkpoint's own MTP "
                "layers only; vLLM's figures for a separate drafter come without it",
            )
    drafter = identify_drafter(options.drafter, options.trust_pickle)
    log(drafter.described())
    return drafter


def _naming(findings: list[Finding], drafter: SeparateDrafter) -> list[Finding]:
    """The engine figure's finding with the drafter's kind and method in its details, then
    one INFO that names them."""
    if not findings:
        return findings
    first = replace(findings[0], details={**findings[0].details, **drafter.details()})
    named = Finding(str(drafter.path), Status.INFO, f"{drafter.described()} (--drafter)",
                    drafter.details())  # fmt: skip
    return [first, named, *findings[1:]]


def _run_checkpoint(
    plan: _Plan,
    runs: _Runs,
    ckpt: Checkpoint,
    analysis: MtpAnalysis,
    directory: Path,
    label: str,
) -> None:
    """One checkpoint through vLLM with every workload's prompts (and, with
    ``--teacher-forced``, mtpcheck's figures at the positions it drafted) into ``runs``."""
    if plan.drafter is None:  # the checkpoint's own MTP layers draft
        why = missing_drafter(analysis)
        if why is not None:
            runs.missing[ckpt.path] = why
            plan.log(f"{label}{ckpt.path}: no drafter ({why}); vLLM not started")
            return
        runs.served.extend(copies_finding(ckpt, analysis))
    options, settings = plan.options, plan.options.vllm
    everything = [p for w in plan.workloads for p in plan.prompts[w.name]]
    how = "MTP" if plan.drafter is None else f"drafter {plan.drafter.method}"
    plan.log(
        f"{label}{ckpt.path}: vLLM ({settings.python}), {how} k={plan.k}, {settings.parallel}, "
        f"{len(everything)} prompts"
    )
    run = run_vllm(
        directory,
        dict(ckpt.config),
        everything,
        plan.k,
        options.new_tokens,
        options.temperature,
        settings,
        speculative_config=None
        if plan.drafter is None
        else plan.drafter.speculative_config(plan.k),
    )
    plan.log(f"{label}{ckpt.path}: vLLM {run.version}: {run.drafts} steps in {run.seconds:.1f} s")
    _split_by_workload(plan, runs, ckpt.path, run)
    if options.teacher_forced:
        _add_teacher_forced(plan, runs, ckpt, analysis, label)


def _split_by_workload(plan: _Plan, runs: _Runs, path: str, run: EngineRun) -> None:
    """The run's requests back to their workloads (sent in the workloads' order), and each
    workload's figures."""
    start = 0
    for w in plan.workloads:
        n = len(plan.prompts[w.name])
        part = run.requests[start : start + n]
        start += n
        runs.requests[(path, w.name)] = part
        runs.results[(path, w.name)] = _acceptance(path, w, part, run.version, plan.k, plan.options)


def _add_teacher_forced(
    plan: _Plan, runs: _Runs, ckpt: Checkpoint, analysis: MtpAnalysis, label: str
) -> None:
    """``--teacher-forced``: load the checkpoint through transformers and score the engine's
    own output at the positions it drafted, beside each workload's engine figure."""
    started = time.monotonic()
    layout = drafter_layouts(ckpt, analysis)
    if isinstance(layout, str):  # pragma: no cover - missing_drafter said None
        raise MtpcheckError(f"{ckpt.path}: {layout}")
    device = resolve_device(plan.options.device)
    drafter = load_drafter(ckpt, layout, device, plan.options.dtype, None, None)
    for w in plan.workloads:
        key = (ckpt.path, w.name)
        runs.results[key] = _with_teacher_forced(
            runs.results[key], drafter, plan.prompts[w.name], runs.requests[key]
        )
    plan.log(
        f"{label}{ckpt.path}: teacher-forced at the engine's positions in "
        f"{time.monotonic() - started:.1f} s"
    )
    del drafter


def _deltas(inputs: Inputs, runs: _Runs, k: int) -> list[EngineDelta]:
    """``--compare`` with a drafter on both sides: B - A per workload, paired over requests."""
    if len(inputs.checkpoints) != 2 or runs.missing:
        return []
    a, b = (c.path for c in inputs.checkpoints)
    return [
        EngineDelta(w.name, *_paired(runs.requests[(a, w.name)], runs.requests[(b, w.name)], k))
        for w in inputs.workloads
    ]


def _workload_findings(
    workload: str,
    inputs: Inputs,
    runs: _Runs,
    deltas: list[EngineDelta],
    min_acceptance: float | None,
) -> list[Finding]:
    """One workload's findings: per checkpoint its figures (or why it has no drafter) and a
    disagreement with the teacher-forced figure; then B - A."""
    findings = []
    for ckpt, analysis in zip(inputs.checkpoints, inputs.analyses, strict=True):
        if ckpt.path in runs.missing:
            declared = analysis.declared.value
            said = f"; the config declares {declared} MTP layer(s)" if declared else ""
            message = f"no drafter ({runs.missing[ckpt.path]}){said}"
            findings.append(Finding(ckpt.path, no_drafter_status(declared), message))
        else:
            result = runs.results[(ckpt.path, workload)]
            findings.append(_finding(result, min_acceptance))
            differs = _disagreement(result)
            if differs is not None:
                findings.append(differs)
    findings += [
        compared_finding(
            f"position 1 {shown(d.first_position, '+.3f')}, mean acceptance length "
            f"{shown(d.mean_acceptance_length, '+.2f')}",
            {
                "first_position": d.first_position.value,
                "mean_acceptance_length": d.mean_acceptance_length.value,
            },
        )
        for d in deltas
        if d.workload == workload
    ]
    return findings


def _paired(
    a: tuple[EngineRequest, ...], b: tuple[EngineRequest, ...], k: int
) -> tuple[Estimate, Estimate]:
    """B - A of the position-1 acceptance and of the mean acceptance length, paired over
    requests."""

    def counts(
        rs: tuple[EngineRequest, ...], count: Callable[[EngineRequest], int]
    ) -> tuple[list[int], list[int]]:
        return [count(r) for r in rs], [r.steps for r in rs]

    position = paired_ratio_difference(
        counts(a, lambda r: r.reached(1)), counts(b, lambda r: r.reached(1))
    )
    length = paired_ratio_difference(
        counts(a, lambda r: r.accepted), counts(b, lambda r: r.accepted), bounds=(-k, k)
    )
    return position, length
