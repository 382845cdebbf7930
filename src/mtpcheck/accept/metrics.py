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

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mtpcheck.accept.stats import (  # noqa: F401  (re-exported)
    Z_975,
    paired_ratio_difference,
    ratio_estimate,
    t_quantile_975,
)
from mtpcheck.model import Estimate


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


def greedy_rate(counts: Sequence[SequenceCounts]) -> Estimate:
    """Greedy acceptance pooled over positions, with its interval over sequences."""
    return ratio_estimate([c.greedy_hits for c in counts], [c.positions for c in counts])


def alpha_rate(counts: Sequence[SequenceCounts]) -> Estimate:
    """Alpha pooled over positions, with its interval over sequences."""
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
