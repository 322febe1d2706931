"""Small statistics: moments, an exact binomial (McNemar) test and its power, Holm's correction and a
seeded bootstrap.

Written out rather than imported: scipy is not a dependency (statsmodels neither, whose McNemar power is
a normal approximation anyway), and each piece is a few lines whose exact behaviour (population vs sample
variance, two-sided p-value convention, the power of the test the report actually runs) is documented.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def mean(xs: Sequence[float]) -> float | None:
    """Arithmetic mean; None for an empty sequence (the report prints a dash, never a fake 0)."""
    return sum(xs) / len(xs) if xs else None


def pvar(xs: Sequence[float]) -> float | None:
    """Population variance (divide by n): the estimator whose levels add up exactly in a balanced nest."""
    if not xs:
        return None
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def sample_sd(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (divide by n − 1); None with fewer than two values."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def cv(xs: Sequence[float]) -> float | None:
    """Coefficient of variation: population sd / mean; None when undefined (empty or mean 0)."""
    if not xs:
        return None
    m = sum(xs) / len(xs)
    if m == 0:
        return None
    return math.sqrt(pvar(xs) or 0.0) / m


def binom_two_sided(k: int, n: int) -> float:
    """Exact two-sided p-value of k successes in n fair-coin trials (doubling the smaller tail, capped at 1)."""
    if n == 0:
        return 1.0
    k = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Exact McNemar test: only discordant pairs carry information; under H0 each side wins with p = 1/2."""
    return binom_two_sided(min(a_only, b_only), a_only + b_only)


@functools.lru_cache(maxsize=4096)
def _critical(d: int, alpha: float) -> int:
    """The largest k with ``binom_two_sided(k, d) < alpha`` (-1: none): :func:`mcnemar_exact` on d discordant
    pairs rejects exactly when the smaller side has at most this many."""
    tail, k = 0, -1
    while k + 1 <= d // 2:
        tail += math.comb(d, k + 1)
        if 2 * tail >= alpha * 2**d:
            break
        k += 1
    return k


def _log_binom_pmf(k: int, n: int, log_p: float, log_q: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q


def _binom_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0 or p >= 1.0:
        return float(k == (n if p >= 1.0 else 0))
    return math.exp(_log_binom_pmf(k, n, math.log(p), math.log1p(-p)))


def mcnemar_power(n: int, p10: float, p01: float, alpha: float = 0.05) -> float:
    """Exact power of :func:`mcnemar_exact` at level ``alpha`` (rejecting at p < alpha) for ``n`` pairs whose
    discordant cells have probabilities ``p10`` (A succeeds, B fails) and ``p01`` (B succeeds, A fails).

    The conditional test's unconditional power: the number of discordant pairs D is Binomial(n, p10 + p01);
    given D = d, the pairs B wins are Binomial(d, p01 / (p10 + p01)), and the test rejects when the smaller
    side is at most :func:`_critical`. Power = Σ_d P(D = d) · P(reject | d) (SAS PROC POWER's
    ``DIST=EXACT_COND``). Terms with P(D = d) < 1e-15 are left out."""
    psi = p10 + p01
    if n <= 0 or psi <= 0.0:
        return 0.0
    pi = p01 / psi
    total = 0.0
    mode = min(n, int(n * psi))
    for step in (1, -1):  # outwards from the mode until the terms vanish
        d = mode if step == 1 else mode - 1
        while 0 <= d <= n:
            weight = _binom_pmf(d, n, min(psi, 1.0))
            if weight < 1e-15 and abs(d - n * psi) > 1:
                break
            c = _critical(d, alpha)
            if c >= 0:
                total += weight * sum(_binom_pmf(k, d, pi) + _binom_pmf(d - k, d, pi) for k in range(c + 1))
            d += step
    return min(1.0, total)


def paired_cells(base_rate: float, effect: float, correlation: float = 0.0) -> tuple[float, float]:
    """(p10, p01) of a paired binary outcome whose A side succeeds with ``base_rate``, B side with
    ``base_rate + effect``, the two correlated with phi coefficient ``correlation`` (0: independent given
    the pair), capped at the largest the margins allow."""
    p0, p1 = base_rate, base_rate + effect
    both = p0 * p1 + correlation * math.sqrt(p0 * (1 - p0) * p1 * (1 - p1))
    both = min(max(both, max(0.0, p0 + p1 - 1)), min(p0, p1))
    return p0 - both, p1 - both


@functools.lru_cache(maxsize=1024)
def paired_mde(n: int, base_rate: float, *, alpha: float = 0.05, power: float = 0.8,
               correlation: float = 0.0) -> float | None:
    """The minimum detectable effect, in percentage points: the smallest rise of B's success over A's
    ``base_rate`` that :func:`mcnemar_exact` at ``alpha`` detects with probability ``power`` in ``n`` pairs
    (:func:`mcnemar_power` under :func:`paired_cells`), to 0.1 point. None: no rise up to 100 % is."""
    def enough(effect: float) -> bool:
        return mcnemar_power(n, *paired_cells(base_rate, effect, correlation), alpha=alpha) >= power

    top = round(1000 * (1 - base_rate))
    if top <= 0 or not enough(top / 1000):
        return None
    lo, hi = 0, top  # in tenths of a point: not enough at lo, enough at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid / 1000) else (mid, hi)
    return hi / 10


def mcnemar_n_normal(p10: float, p01: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Pairs needed by the normal approximation to McNemar's test (Connor 1987, Biometrics 43:207-211, p. 209):
    n = (z_{1-α/2} √ψ + z_{power} √(ψ − δ²))² / δ², ψ = p10 + p01, δ = p01 − p10."""
    psi, delta = p10 + p01, p01 - p10
    z = statistics.NormalDist()
    return ((z.inv_cdf(1 - alpha / 2) * math.sqrt(psi) + z.inv_cdf(power) * math.sqrt(psi - delta**2)) / delta) ** 2


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (same order as given): controls the family-wise error rate."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def cluster_bootstrap_ci(
    clusters: dict[K, list[float]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    stat: Callable[[list[float]], float] | None = None,
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of ``stat`` (default: the mean) resampling whole clusters with replacement.

    Clusters (tasks) rather than single values are resampled because runs and variations of one task
    are correlated; treating them as independent would make the interval too narrow.
    """
    keys = sorted(clusters, key=repr)
    if not keys or not any(clusters[k] for k in keys):
        return None
    stat = stat or (lambda v: sum(v) / len(v))
    rng = random.Random(seed)
    values: list[float] = []
    for _ in range(n_boot):
        sample: list[float] = []
        while not sample:  # a resample of only empty clusters has no statistic: draw again
            for _k in keys:
                sample.extend(clusters[keys[rng.randrange(len(keys))]])
        values.append(stat(sample))
    values.sort()
    alpha = (1 - level) / 2
    return _quantile(values, alpha), _quantile(values, 1 - alpha)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an already sorted list."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
