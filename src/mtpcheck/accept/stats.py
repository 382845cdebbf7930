"""Acceptance statistics without torch: pooled ratios over clusters (requests or sequences)
with 95 % intervals, their paired differences, and the one-sided test that holds a measured
share to a reference (a saved profile, or the offline expectation).

Rates pool positions (ratio of sums, as serving engines pool counters); the interval is over
clusters, because positions of one sequence are not independent: the linearised
(delta-method) variance of a ratio estimator with a Student-t quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mtpcheck.model import Estimate, Share

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
    se = ratio_standard_error(numerators, denominators)
    if se is None:
        return Estimate(ratio, None, None)
    half = t_quantile_975(len(numerators) - 1) * se
    return Estimate(ratio, max(bounds[0], ratio - half), min(bounds[1], ratio + half))


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


def ratio_standard_error(
    numerators: Sequence[float], denominators: Sequence[float]
) -> float | None:
    """The linearised standard error of ``sum(y) / sum(n)`` over clusters (None with fewer
    than two clusters or no denominator): the spread :func:`ratio_estimate`'s interval is
    made of, kept so that a later run can be tested against this one."""
    total = float(sum(denominators))
    m = len(numerators)
    if total <= 0 or m < 2:
        return None
    ratio = float(sum(numerators)) / total
    squares = sum((y - ratio * n) ** 2 for y, n in zip(numerators, denominators, strict=True))
    return math.sqrt(m / (m - 1) * squares) / total


def ratio_share(numerators: Sequence[float], denominators: Sequence[float]) -> Share:
    """:func:`ratio_estimate` with its standard error, for a later run to be tested against."""
    return Share(
        ratio_estimate(numerators, denominators),
        ratio_standard_error(numerators, denominators),
    )


#: The family-wise false-alarm rate of a profile or expectation gate: across every workload
#: and position it holds, an unchanged deployment fails at most this often.
GATE_LEVEL = 0.01


@dataclass(frozen=True)
class Shortfall:
    """A measured share held to a reference share: the one-sided z test of ``measured <
    reference`` on both sides' standard errors, Bonferroni-corrected over ``comparisons``."""

    measured: float
    reference: float
    z: float | None
    """(measured - reference) / sqrt(se_m^2 + se_r^2); None where both errors are 0 or
    unknown (then any drop at all is a shortfall)."""
    p_value: float | None
    """One-sided: the chance of a drop this large from an unchanged deployment."""
    threshold: float
    """The p-value below which it fails: ``GATE_LEVEL / comparisons``."""

    @property
    def falls_short(self) -> bool:
        """Whether the drop fails: significant, or any drop where no error is known."""
        if self.p_value is None:
            return self.measured < self.reference
        return self.p_value < self.threshold

    @property
    def test(self) -> str:
        """The test, in words, for the report."""
        if self.p_value is None:
            return "no spread known on either side: any drop fails"
        return (
            f"one-sided z = {self.z:.2f}, p = {self.p_value:.2g} against "
            f"{GATE_LEVEL:g} / {round(GATE_LEVEL / self.threshold)} (Bonferroni)"
        )


def shortfall(
    measured: float,
    measured_se: float | None,
    reference: float,
    reference_se: float | None,
    comparisons: int,
) -> Shortfall:
    """Hold ``measured`` to ``reference``; ``comparisons`` tests share :data:`GATE_LEVEL`."""
    threshold = GATE_LEVEL / max(1, comparisons)
    spread = math.sqrt((measured_se or 0.0) ** 2 + (reference_se or 0.0) ** 2)
    if spread == 0.0:
        return Shortfall(measured, reference, None, None, threshold)
    z = (measured - reference) / spread
    p_value = 0.5 * math.erfc(-z / math.sqrt(2.0))  # the normal CDF at z
    return Shortfall(measured, reference, z, p_value, threshold)


def shown(e: Estimate, spec: str = ".3f") -> str:
    """``0.950 [0.940, 0.960]``: the value (as ``spec``) and its interval, where there is
    one."""
    if e.low is None or e.high is None:
        return f"{e.value:{spec}}"
    return f"{e.value:{spec}} [{e.low:.3f}, {e.high:.3f}]"
