"""The verdicts of ``accept --server`` on one workload: the engine's figures, the profile they
are held to, and what the checkpoint's own drafter accepts offline (whose loss is it?)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mtpcheck.accept.drafter import Drafter
from mtpcheck.accept.server_profile import Held
from mtpcheck.accept.stats import Shortfall, shortfall, shown
from mtpcheck.model import CheckName, CheckResult, Finding, ServerAcceptance, Status


def describe(r: ServerAcceptance) -> str:
    """The figures in one line."""
    if r.by_position:
        figures = "accepted per position " + " / ".join(shown(s.estimate) for s in r.by_position)
    else:
        figures = f"draft tokens accepted {shown(r.acceptance.estimate)}"
    length = ""
    if r.mean_acceptance_length is not None:
        length = f", mean acceptance length {shown(r.mean_acceptance_length, '.2f')}"
    steps = f"{r.drafts} steps, " if r.drafts is not None else ""
    return (
        f"{r.engine}, k={r.k if r.k is not None else '?'}, T={r.temperature:g}: {figures}"
        f"{length}; {steps}{r.draft_tokens} draft tokens in {r.requests} requests "
        f"({r.source}; 95% CI over requests)"
    )


def _details(r: ServerAcceptance) -> dict[str, Any]:
    return {
        "engine": r.engine,
        "k": r.k,
        "drafts": r.drafts,
        "draft_tokens": r.draft_tokens,
        "accepted_tokens": r.accepted_tokens,
        "accepted_per_position": list(r.accepted_per_position),
    }


def figures_finding(r: ServerAcceptance, min_acceptance: float | None) -> Finding:
    """PASS with the figures; FAIL where nothing was drafted or position 1 is below the
    gate."""
    details = _details(r)
    if r.draft_tokens == 0:
        return Finding(
            r.server,
            Status.FAIL,
            f"no drafter served: {r.engine} drafted nothing in {r.requests} requests "
            "(speculative decoding off, or its drafter not loaded)",
            details,
        )
    first = r.by_position[0].estimate.value if r.by_position else r.acceptance.estimate.value
    if min_acceptance is not None:
        details["min_acceptance"] = min_acceptance
        if first < min_acceptance:
            what = "position 1" if r.by_position else "draft-token acceptance"
            return Finding(
                r.server,
                Status.FAIL,
                f"{describe(r)}; {what} below --min-acceptance {min_acceptance:g}",
                details,
            )
    return Finding(r.server, Status.PASS, describe(r), details)


def _engine_shortfalls(r: ServerAcceptance, comparisons: int) -> list[Shortfall]:
    """Per position: the engine's share held to the checkpoint's offline one."""
    return [
        shortfall(s.estimate.value, s.error, e.estimate.value, e.error, comparisons)
        for s, e in zip(r.by_position, r.expected, strict=False)
    ]


def expectation_findings(r: ServerAcceptance, comparisons: int) -> list[Finding]:
    """With CKPT: FAIL per position where the engine accepts less than the checkpoint's own
    drafter does offline by vLLM's draft rule (the engine's loss); else one INFO."""
    if not r.expected:
        return []
    tests = _engine_shortfalls(r, comparisons)
    failing = [
        Finding(
            r.server,
            Status.FAIL,
            f"position {i}: {r.engine} accepts {t.measured:.3f} where the checkpoint's drafter "
            f"accepts {t.reference:.3f} offline on the same prompts by vLLM's draft rule "
            f"({t.test}): the engine serving it loses acceptance the checkpoint has",
            {"position": i, "served": t.measured, "expected": t.reference, "p_value": t.p_value},
        )
        for i, t in enumerate(tests, 1)
        if t.falls_short
    ]
    if failing:
        return failing
    offline = " / ".join(f"{e.estimate.value:.3f}" for e in r.expected)
    return [
        Finding(
            r.server,
            Status.INFO,
            f"the checkpoint's drafter accepts {offline} offline on the same prompts by vLLM's "
            "draft rule: the engine serves what the checkpoint has",
            {"expected": [e.estimate.value for e in r.expected]},
        )
    ]


def _whose(r: ServerAcceptance, position: int, comparisons: int) -> str:
    if not r.expected or position == 0 or position > len(r.expected):
        return "; give CKPT to tell the checkpoint's drafter from the engine serving it"
    engine = _engine_shortfalls(r, comparisons)[position - 1]
    if engine.falls_short:
        return "; the engine's loss (the checkpoint's drafter accepts more offline)"
    return (
        f"; the checkpoint's drafter's loss (offline it accepts {engine.reference:.3f} "
        "on the same prompts too)"
    )


def profile_findings(
    r: ServerAcceptance,
    held: Sequence[Held],
    absent: bool,
    profile: Path | None,
    comparisons: int,
) -> list[Finding]:
    """The workload's figures held to a saved profile (``--profile``)."""
    if profile is None:
        return []
    if absent:
        return [Finding(r.server, Status.WARN, f"not in profile {profile}: not held to it")]
    mine = [h for h in held if h.workload == r.workload]
    failing = [
        Finding(
            r.server,
            Status.FAIL,
            f"{'position ' + str(h.position) if h.position else 'draft-token acceptance'}: "
            f"{h.result.measured:.3f} below profile {profile}'s {h.result.reference:.3f} "
            f"({h.result.test}){_whose(r, h.position, comparisons)}",
            {
                "position": h.position,
                "served": h.result.measured,
                "profile": h.result.reference,
                "p_value": h.result.p_value,
            },
        )  # fmt: skip
        for h in mine
        if h.result.falls_short
    ]
    if failing:
        return failing
    kept = " / ".join(f"{h.result.reference:.3f}" for h in mine)
    return [Finding(r.server, Status.PASS, f"holds to profile {profile} ({kept})")]


def workload_check(
    r: ServerAcceptance,
    note: str,
    min_acceptance: float | None,
    held: Sequence[Held],
    absent: bool,
    profile: Path | None,
    comparisons: int,
    drafter: Drafter | None = None,
) -> CheckResult:
    """The check of one workload the server ran; ``drafter``: the separate drafter the user
    says the server drafts with (``--drafter``), named with its vLLM method."""
    findings = [figures_finding(r, min_acceptance)]
    if drafter is not None:
        first = findings[0]
        findings[0] = replace(first, details={**first.details, **drafter.details()})
        findings.append(
            Finding(r.server, Status.INFO, f"{drafter.described()} (--drafter)", drafter.details())
        )
    if note:
        findings.append(Finding(r.server, Status.INFO, note))
    if r.draft_tokens:
        findings += expectation_findings(r, comparisons)
        findings += profile_findings(r, held, absent, profile, comparisons)
    what = "MTP" if drafter is None else drafter.title
    return CheckResult(
        CheckName.ACCEPTANCE,
        f"{what} acceptance served by {r.engine} on workload {r.workload}",
        tuple(findings),
        workload=r.workload,
    )
