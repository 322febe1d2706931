"""Small statistics: moments, an exact binomial (McNemar) test, Holm's correction and a seeded bootstrap.

Written out rather than imported: scipy is not a dependency, and each piece is a few lines whose
exact behaviour (population vs sample variance, two-sided p-value convention) the report documents.
"""

from __future__ import annotations

import math
import random
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
