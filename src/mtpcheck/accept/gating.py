"""Results and findings of ``accept``: the rates of one workload, the per-depth chain, the
sentence each finding says, and the ``--min-acceptance`` gate."""

from __future__ import annotations

from collections.abc import Sequence

from mtpcheck.accept.metrics import (
    ChainCounts,
    SequenceCounts,
    alpha_rate,
    chain_rates,
    chain_tokens_per_pass,
    greedy_rate,
)
from mtpcheck.accept.stats import shown  # noqa: F401  (re-exported)
from mtpcheck.accept.workloads import Workload
from mtpcheck.families import ChainHidden
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    ChainAcceptance,
    DepthAcceptance,
    Finding,
    Status,
)


def chain_result(chained: Sequence[ChainCounts], hidden: ChainHidden) -> ChainAcceptance:
    """The chain's figures per depth, from its per-sequence counters."""
    rates = chain_rates(chained)
    depths = tuple(
        DepthAcceptance(d, g, a, 1 + sum(r.value for _, r in rates[:d]))
        for d, (g, a) in enumerate(rates, start=1)
    )
    tokens = chain_tokens_per_pass(chained, greedy=False)
    return ChainAcceptance(
        hidden=hidden.value,
        positions=sum(c.positions for c in chained),
        depths=depths,
        tokens_per_pass=tokens,
        greedy_tokens_per_pass=chain_tokens_per_pass(chained, greedy=True).value,
    )


def result(
    label: str,
    workload: Workload,
    counts: list[SequenceCounts],
    temperature: float,
    note: str,
    chain: ChainAcceptance | None = None,
) -> AcceptanceResult:
    """One checkpoint's figures on one workload (``note``: why it has no drafter, if so)."""
    greedy, alpha = greedy_rate(counts), alpha_rate(counts)
    return AcceptanceResult(
        checkpoint=label,
        workload=workload.name,
        drafter=not note,
        note=note,
        sequences=sum(1 for c in counts if c.positions),
        positions=sum(c.positions for c in counts),
        greedy_hits=sum(c.greedy_hits for c in counts),
        greedy=greedy,
        alpha=alpha,
        tokens_per_pass=1.0 + alpha.value,
        temperature=temperature,
        chain=chain,
    )


def no_drafter_status(declared: int | None) -> Status:
    """A checkpoint without a drafter fails when its config declares MTP layers (a serving
    engine will look for them) and warns when it declares none."""
    return Status.FAIL if declared else Status.WARN


def describe(r: AcceptanceResult) -> str:
    """The sentence a teacher-forced figure's finding says."""
    if not r.drafter:
        return f"no drafter ({r.note}): acceptance 0, 1.00 tokens per pass"
    chained = ""
    if r.chain is not None:
        c = r.chain
        chained = (
            f"; {len(c.depths)} MTP layers chained ({c.hidden}): all {len(c.depths)} drafts "
            f"accepted {c.depths[-1].alpha.value:.3f}, "
            f"{shown(c.tokens_per_pass, '.2f')} tokens per pass"
        )
    return (
        f"greedy {shown(r.greedy)}, alpha {shown(r.alpha)} at T={r.temperature:g}, "
        f"{r.tokens_per_pass:.2f} tokens per pass{chained}; {r.positions} positions in "
        f"{r.sequences} sequences (95% CI over sequences)"
    )


def describe_delta(d: AcceptanceDelta) -> str:
    """The sentence of a workload's ``B - A`` finding."""
    return (
        f"greedy {shown(d.greedy, '+.3f')}, alpha {shown(d.alpha, '+.3f')}, "
        f"tokens per pass {d.tokens_per_pass:+.3f}"
    )


def finding(
    r: AcceptanceResult, min_acceptance: float | None, declared: int | None = None
) -> Finding:
    """One checkpoint's finding on one workload, held to ``--min-acceptance``."""
    details = {
        "greedy": r.greedy.value,
        "alpha": r.alpha.value,
        "tokens_per_pass": r.tokens_per_pass,
        "positions": r.positions,
        "drafter": r.drafter,
    }
    if min_acceptance is not None:
        details["min_acceptance"] = min_acceptance
        if r.alpha.value < min_acceptance:
            message = f"{describe(r)}; below --min-acceptance {min_acceptance:g}"
            return Finding(r.checkpoint, Status.FAIL, message, details)
    if r.drafter:
        return Finding(r.checkpoint, Status.PASS, describe(r), details)
    said = f"; the config declares {declared} MTP layer(s)" if declared else ""
    return Finding(r.checkpoint, no_drafter_status(declared), describe(r) + said, details)
