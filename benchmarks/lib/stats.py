"""The one percentile definition of the benchmarks: nearest rank.

The p-th percentile of n values is the value of rank ``ceil(n * p / 100)`` (at least 1) in
ascending order: always one of the measured values, never an interpolation between two. Every
table of every scenario uses it, so p99s compare across result files written since it became
the only one (``benchmarks/results/README.md`` says which older files used another).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def rank(n: int, q: float) -> int:
    """The 1-based nearest rank of percentile ``q`` (0..100) among ``n`` values."""
    return max(1, math.ceil(n * q / 100))


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values`` (any order); NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[rank(len(ordered), q) - 1]


def bucket_percentile(counts: Mapping[int, int], q: float, width: float) -> float:
    """Nearest-rank percentile ``q`` of values counted in buckets ``[i * width, (i + 1) * width)``:
    the upper edge of the bucket holding that rank; NaN when nothing was counted."""
    total = sum(counts.values())
    if not total:
        return float("nan")
    wanted = rank(total, q)
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= wanted:
            return (bucket + 1) * width
    return float("nan")
