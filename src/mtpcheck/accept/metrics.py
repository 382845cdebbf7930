"""Acceptance arithmetic: per-position scores, pooled rates and confidence intervals.

Per position (k = 1): ``p`` is the main model's distribution for a token, ``q`` the MTP head's
distribution for the same token. Greedy acceptance is ``argmax q == argmax p``; probabilistic
acceptance is ``alpha = sum_v min(p(v), q(v))``, the probability that speculative sampling
(draft from q, accept with ``min(1, p/q)``) keeps the draft. At temperature 0 both
distributions are one-hot and alpha is the greedy hit.

Rates pool positions (ratio of sums, as serving engines pool counters); the 95 % interval is
over sequences, because positions of one sequence are not independent: the linearised
(delta-method) variance of a ratio estimator with a Student-t quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mtpcheck.model import Estimate

Z_975 = 1.959963984540054
_T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
"""Two-sided 95 % Student-t quantiles for 1..30 degrees of freedom."""


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1")
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = Z_975
    # Cornish-Fisher expansion around the normal quantile; < 1e-3 off for df > 30.
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def distributions(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Row-wise probabilities (float64) at ``temperature``; one-hot argmax at 0."""
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    logits = logits.to(torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(
            torch.float64
        )
    return torch.softmax(logits / temperature, dim=-1)


def greedy_hits(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Per row: does the draft's argmax equal the target's argmax (first index on ties)."""
    return p_logits.argmax(dim=-1) == q_logits.argmax(dim=-1)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Per row: ``sum_v min(p(v), q(v))`` of two probability tables."""
    return torch.minimum(p, q).sum(dim=-1)


def alpha_per_position(
    p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per row: probabilistic acceptance of a draft from q against a target p."""
    return overlap(distributions(p_logits, temperature), distributions(q_logits, temperature))


def argmax_acceptance(
    p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per row: the probability that the target at ``temperature`` accepts q's argmax,
    ``p_T(argmax q)`` (the greedy hit at T = 0)."""
    p = distributions(p_logits, temperature)
    return p.gather(-1, q_logits.argmax(dim=-1, keepdim=True).to(p.device)).squeeze(-1)


@dataclass(frozen=True)
class SequenceCounts:
    """Counters of one sequence: scored positions, greedy hits and the sum of alpha."""

    positions: int
    greedy_hits: int
    alpha_sum: float


def ratio_estimate(
    numerators: Sequence[float],
    denominators: Sequence[float],
    bounds: tuple[float, float] = (0.0, 1.0),
) -> Estimate:
    """``sum(y) / sum(n)`` with a 95 % interval over the (y_i, n_i) clusters.

    Variance of the ratio by linearisation: ``m / (m - 1) * sum((y_i - R n_i)^2) / (sum n)^2``;
    the half-width uses Student's t with ``m - 1`` degrees of freedom. The interval is
    clipped to ``bounds``. Fewer than two clusters (or no positions) give no interval.
    """
    if len(numerators) != len(denominators):
        raise ValueError("numerators and denominators differ in length")
    total = float(sum(denominators))
    if total <= 0:
        return Estimate(0.0, None, None)
    ratio = float(sum(numerators)) / total
    m = len(numerators)
    if m < 2:
        return Estimate(ratio, None, None)
    squares = sum((y - ratio * n) ** 2 for y, n in zip(numerators, denominators, strict=True))
    se = math.sqrt(m / (m - 1) * squares) / total
    half = t_quantile_975(m - 1) * se
    return Estimate(ratio, max(bounds[0], ratio - half), min(bounds[1], ratio + half))


def greedy_rate(counts: Sequence[SequenceCounts]) -> Estimate:
    return ratio_estimate([c.greedy_hits for c in counts], [c.positions for c in counts])


def alpha_rate(counts: Sequence[SequenceCounts]) -> Estimate:
    return ratio_estimate([c.alpha_sum for c in counts], [c.positions for c in counts])


def paired_difference(
    reference: Sequence[SequenceCounts], other: Sequence[SequenceCounts]
) -> tuple[Estimate, Estimate]:
    """(greedy, alpha) of ``other`` minus ``reference`` over the same sequences."""
    if len(reference) != len(other) or any(
        a.positions != b.positions for a, b in zip(reference, other, strict=True)
    ):
        raise ValueError("paired difference needs the same sequences on both sides")
    n = [a.positions for a in reference]
    greedy = ratio_estimate(
        [b.greedy_hits - a.greedy_hits for a, b in zip(reference, other, strict=True)],
        n,
        bounds=(-1.0, 1.0),
    )
    alpha = ratio_estimate(
        [b.alpha_sum - a.alpha_sum for a, b in zip(reference, other, strict=True)],
        n,
        bounds=(-1.0, 1.0),
    )
    return greedy, alpha


def paired_ratio_difference(
    reference: tuple[Sequence[float], Sequence[float]],
    other: tuple[Sequence[float], Sequence[float]],
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> Estimate:
    """``sum(y_b) / sum(n_b) - sum(y_a) / sum(n_a)`` over the same clusters (each side its own
    denominators: a decoding run's steps per request differ between checkpoints), with a 95 %
    interval from the linearised variance of the paired per-cluster residuals."""
    (ya, na), (yb, nb) = reference, other
    if not len(ya) == len(na) == len(yb) == len(nb):
        raise ValueError("paired difference needs the same clusters on both sides")
    total_a, total_b = float(sum(na)), float(sum(nb))
    if total_a <= 0 or total_b <= 0:
        return Estimate(0.0, None, None)
    ra, rb = sum(ya) / total_a, sum(yb) / total_b
    diff = rb - ra
    m = len(ya)
    if m < 2:
        return Estimate(diff, None, None)
    residuals = [
        (y2 - rb * n2) / total_b - (y1 - ra * n1) / total_a
        for y1, n1, y2, n2 in zip(ya, na, yb, nb, strict=True)
    ]
    half = t_quantile_975(m - 1) * math.sqrt(m / (m - 1) * sum(r * r for r in residuals))
    return Estimate(diff, max(bounds[0], diff - half), min(bounds[1], diff + half))


@dataclass(frozen=True)
class ChainCounts:
    """Counters of one sequence for a chain of D drafts, over the slots where all D depths
    can be scored: per depth d, the slots whose drafts 1..d all hit (greedy) and the sum of
    the product of alpha over depths 1..d."""

    positions: int
    greedy_hits: tuple[int, ...]
    alpha_sums: tuple[float, ...]


def chain_counts(
    positions: int, hits: Sequence[torch.Tensor], alphas: Sequence[torch.Tensor]
) -> ChainCounts:
    """Cumulative counters from per-depth verdicts; depth j's tensors start at slot 0 and only
    their first ``positions`` slots are used."""
    if positions <= 0:
        return ChainCounts(0, (0,) * len(hits), (0.0,) * len(hits))
    all_hit = torch.ones(positions, dtype=torch.bool)
    product = torch.ones(positions, dtype=torch.float64)
    greedy, alpha = [], []
    for h, a in zip(hits, alphas, strict=True):
        all_hit = all_hit & h[:positions].to(torch.bool)
        product = product * a[:positions].to(torch.float64)
        greedy.append(int(all_hit.sum()))
        alpha.append(float(product.sum()))
    return ChainCounts(positions, tuple(greedy), tuple(alpha))


def chain_rates(counts: Sequence[ChainCounts]) -> list[tuple[Estimate, Estimate]]:
    """Per depth: (greedy, alpha) shares of slots with drafts 1..d all accepted."""
    depths = len(counts[0].greedy_hits) if counts else 0
    n = [c.positions for c in counts]
    return [
        (
            ratio_estimate([c.greedy_hits[d] for c in counts], n),
            ratio_estimate([c.alpha_sums[d] for c in counts], n),
        )
        for d in range(depths)
    ]


def chain_tokens_per_pass(counts: Sequence[ChainCounts], greedy: bool) -> Estimate:
    """Expected tokens per verify pass with k = D: 1 + the expected accepted drafts."""
    depths = len(counts[0].greedy_hits) if counts else 0
    accepted = [sum(c.greedy_hits) if greedy else sum(c.alpha_sums) for c in counts]
    n = [c.positions for c in counts]
    return ratio_estimate(
        [c.positions + a for c, a in zip(counts, accepted, strict=True)],
        n,
        bounds=(1.0, 1.0 + depths),
    )
