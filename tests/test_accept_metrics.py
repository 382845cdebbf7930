"""Acceptance arithmetic on hand-computed examples (no model involved)."""

from __future__ import annotations

import math

import pytest
import torch

from mtpcheck.accept.metrics import (
    SequenceCounts,
    alpha_per_position,
    alpha_rate,
    distributions,
    greedy_hits,
    greedy_rate,
    overlap,
    paired_difference,
    ratio_estimate,
    t_quantile_975,
)


def logits_of(*rows: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float64))


def test_alpha_is_the_overlap_of_the_two_distributions() -> None:
    p = logits_of([0.5, 0.3, 0.2], [0.1, 0.1, 0.8])
    q = logits_of([0.2, 0.3, 0.5], [0.1, 0.1, 0.8])
    alpha = alpha_per_position(p, q, temperature=1.0)
    # min(.5,.2) + min(.3,.3) + min(.2,.5) = 0.7; identical rows overlap fully
    assert alpha.tolist() == pytest.approx([0.7, 1.0], abs=1e-12)
    assert greedy_hits(p, q).tolist() == [False, True]


def test_temperature_reshapes_both_distributions() -> None:
    p = logits_of([0.5, 0.3, 0.2])
    q = logits_of([0.2, 0.3, 0.5])
    # at T=2 a distribution becomes proportional to sqrt(p)
    sp = [math.sqrt(x) for x in (0.5, 0.3, 0.2)]
    sq = [math.sqrt(x) for x in (0.2, 0.3, 0.5)]
    pt = [x / sum(sp) for x in sp]
    qt = [x / sum(sq) for x in sq]
    expected = sum(min(a, b) for a, b in zip(pt, qt, strict=True))
    assert float(alpha_per_position(p, q, 2.0)[0]) == pytest.approx(expected, abs=1e-12)
    assert distributions(p, 2.0)[0].tolist() == pytest.approx(pt, abs=1e-12)


def test_temperature_zero_makes_alpha_the_greedy_hit() -> None:
    p = logits_of([0.5, 0.3, 0.2], [0.2, 0.5, 0.3])
    q = logits_of([0.4, 0.35, 0.25], [0.5, 0.2, 0.3])
    assert alpha_per_position(p, q, 0.0).tolist() == [1.0, 0.0]
    assert greedy_hits(p, q).tolist() == [True, False]
    assert distributions(p, 0.0).tolist() == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    with pytest.raises(ValueError):
        distributions(p, -1.0)


def test_overlap_of_probability_tables() -> None:
    p = torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    assert overlap(p, q).tolist() == [0.5]


def test_ties_break_to_the_first_index_on_both_sides() -> None:
    p = torch.tensor([[1.0, 1.0, 0.0]])
    q = torch.tensor([[2.0, 2.0, 0.0]])
    assert greedy_hits(p, q).tolist() == [True]


def test_rates_pool_positions_not_sequences() -> None:
    counts = [SequenceCounts(1, 1, 1.0), SequenceCounts(3, 0, 0.6)]
    assert greedy_rate(counts).value == 0.25  # 1 of 4 positions, not mean(1, 0) = 0.5
    assert alpha_rate(counts).value == pytest.approx(0.4)


def test_ratio_interval_by_hand() -> None:
    # R = 6/8; residuals y - R n = -0.5, 0.5, 0; var = 3/2 * 0.5 / 8^2; t(2) = 4.303
    est = ratio_estimate([1, 2, 3], [2, 2, 4])
    half = 4.303 * math.sqrt(1.5 * 0.5) / 8
    assert est.value == 0.75
    assert est.low == pytest.approx(0.75 - half)
    assert est.high == 1.0  # clipped to the bound
    wide = ratio_estimate([1, 2, 3], [2, 2, 4], bounds=(-5.0, 5.0))
    assert wide.high == pytest.approx(0.75 + half)


def test_no_interval_without_two_sequences() -> None:
    one = ratio_estimate([3], [4])
    assert (one.value, one.low, one.high) == (0.75, None, None)
    empty = ratio_estimate([], [])
    assert (empty.value, empty.low, empty.high) == (0.0, None, None)
    with pytest.raises(ValueError):
        ratio_estimate([1], [1, 2])


def test_constant_rate_has_a_zero_width_interval() -> None:
    est = ratio_estimate([2, 4, 6], [4, 8, 12])
    assert (est.value, est.low, est.high) == (0.5, 0.5, 0.5)


def test_paired_difference() -> None:
    a = [SequenceCounts(10, 5, 6.0), SequenceCounts(10, 7, 8.0), SequenceCounts(20, 10, 12.0)]
    same = paired_difference(a, a)
    assert all((e.value, e.low, e.high) == (0.0, 0.0, 0.0) for e in same)
    none = [SequenceCounts(c.positions, 0, 0.0) for c in a]
    greedy, alpha = paired_difference(a, none)
    assert greedy.value == pytest.approx(-22 / 40)
    assert alpha.value == pytest.approx(-26 / 40)
    assert greedy.low is not None and greedy.low < greedy.value < greedy.high
    with pytest.raises(ValueError):
        paired_difference(a, a[:2])


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980)],
)
def test_student_t_quantiles(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=1e-3)


def test_student_t_approaches_the_normal_quantile() -> None:
    assert t_quantile_975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        t_quantile_975(0)
