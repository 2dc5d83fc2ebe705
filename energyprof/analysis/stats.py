"""The statistics behind the compare gate: Welch's t interval of a mean difference. Pure, stdlib only.

Repeats of a run differ (other load on the machine, caches, clocks): a gate that compares one
figure with another fails identical code. Over repeats of each side the difference of the means
has a standard error from the repeats' own spread, and Welch's t (unequal variances, the
Welch-Satterthwaite degrees of freedom) turns it into an interval that stays honest with 2 or 3
repeats, where a bootstrap has too few distinct resamples to mean anything.
"""

from __future__ import annotations

import math
import statistics
from statistics import NormalDist
from typing import Sequence

from ..record import record

CONFIDENCE = 0.95  # two-sided: the gate fails on its lower end, 97.5% one-sided


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom (df may be fractional)."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on the CDF (monotone; 200 halvings reach double precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), not {p}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


@record(frozen=True)
class Interval:
    """A difference of means (head - base) and its two-sided interval at `confidence`.

    `df` is None when the spread came from sampling error alone (one run per side): then the
    interval says how large a change noise of that size could hide, not what repeats showed."""

    diff: float
    low: float
    high: float
    confidence: float
    df: float | None
    n: tuple[int, int]

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def welch(base: Sequence[float], head: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Welch's t interval of mean(head) - mean(base); each side needs two or more values.

    With no spread on either side the interval is the point itself (identical figures differ by 0)."""
    if len(base) < 2 or len(head) < 2:
        raise ValueError("Welch's interval needs at least two values on each side")
    ma, mb = statistics.fmean(base), statistics.fmean(head)
    va, vb = statistics.variance(base) / len(base), statistics.variance(head) / len(head)
    diff, se2 = mb - ma, va + vb
    if se2 <= 0.0:
        return Interval(diff, diff, diff, confidence, math.inf, (len(base), len(head)))
    df = se2 * se2 / ((va * va / (len(base) - 1) if va else 0.0) + (vb * vb / (len(head) - 1) if vb else 0.0))
    half = t_quantile(0.5 + confidence / 2.0, df) * math.sqrt(se2)
    return Interval(diff, diff - half, diff + half, confidence, df, (len(base), len(head)))


def known_error(base: float, base_error: float, head: float, head_error: float,
                confidence: float = CONFIDENCE) -> Interval:
    """One figure per side, each with a known standard error (its sampling error): a normal interval."""
    half = NormalDist().inv_cdf(0.5 + confidence / 2.0) * math.hypot(base_error, head_error)
    diff = head - base
    return Interval(diff, diff - half, diff + half, confidence, None, (1, 1))
