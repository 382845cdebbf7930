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
    rates = chain_rates(chained)
    depths = tuple(
        DepthAcceptance(
            d,
            g.value,
            g.low,
            g.high,
            a.value,
            a.low,
            a.high,
            1 + sum(r.value for _, r in rates[:d]),
        )
        for d, (g, a) in enumerate(rates, start=1)
    )
    tokens = chain_tokens_per_pass(chained, greedy=False)
    return ChainAcceptance(
        hidden=hidden.value,
        positions=sum(c.positions for c in chained),
        depths=depths,
        tokens_per_pass=tokens.value,
        tokens_per_pass_ci_low=tokens.low,
        tokens_per_pass_ci_high=tokens.high,
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
    greedy, alpha = greedy_rate(counts), alpha_rate(counts)
    return AcceptanceResult(
        checkpoint=label,
        workload=workload.name,
        drafter=not note,
        note=note,
        sequences=sum(1 for c in counts if c.positions),
        positions=sum(c.positions for c in counts),
        greedy_hits=sum(c.greedy_hits for c in counts),
        greedy=greedy.value,
        greedy_ci_low=greedy.low,
        greedy_ci_high=greedy.high,
        alpha=alpha.value,
        alpha_ci_low=alpha.low,
        alpha_ci_high=alpha.high,
        tokens_per_pass=1.0 + alpha.value,
        temperature=temperature,
        chain=chain,
    )


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"


def describe(r: AcceptanceResult) -> str:
    if not r.drafter:
        return f"no drafter ({r.note}): acceptance 0, 1.00 tokens per pass"
    chained = ""
    if r.chain is not None:
        c = r.chain
        chained = (
            f"; {len(c.depths)} MTP layers chained ({c.hidden}): all {len(c.depths)} drafts "
            f"accepted {c.depths[-1].alpha:.3f}, "
            f"{c.tokens_per_pass:.2f}"
            f"{_interval(c.tokens_per_pass_ci_low, c.tokens_per_pass_ci_high)} tokens per pass"
        )
    return (
        f"greedy {r.greedy:.3f}{_interval(r.greedy_ci_low, r.greedy_ci_high)}, "
        f"alpha {r.alpha:.3f}{_interval(r.alpha_ci_low, r.alpha_ci_high)} at T={r.temperature:g}, "
        f"{r.tokens_per_pass:.2f} tokens per pass{chained}; {r.positions} positions in "
        f"{r.sequences} sequences (95% CI over sequences)"
    )


def describe_delta(d: AcceptanceDelta) -> str:
    return (
        f"greedy {d.greedy:+.3f}{_interval(d.greedy_ci_low, d.greedy_ci_high)}, "
        f"alpha {d.alpha:+.3f}{_interval(d.alpha_ci_low, d.alpha_ci_high)}, "
        f"tokens per pass {d.tokens_per_pass:+.3f}"
    )


def finding(
    r: AcceptanceResult, min_acceptance: float | None, declared: int | None = None
) -> Finding:
    details = {
        "greedy": r.greedy,
        "alpha": r.alpha,
        "tokens_per_pass": r.tokens_per_pass,
        "positions": r.positions,
        "drafter": r.drafter,
    }
    if min_acceptance is not None:
        details["min_acceptance"] = min_acceptance
        if r.alpha < min_acceptance:
            message = f"{describe(r)}; below --min-acceptance {min_acceptance:g}"
            return Finding(r.checkpoint, Status.FAIL, message, details)
    if not r.drafter and declared:
        # the config promises a drafter a serving engine will look for: the gate fails
        message = f"{describe(r)}; the config declares {declared} MTP layer(s)"
        return Finding(r.checkpoint, Status.FAIL, message, details)
    status = Status.PASS if r.drafter else Status.WARN
    return Finding(r.checkpoint, status, describe(r), details)
