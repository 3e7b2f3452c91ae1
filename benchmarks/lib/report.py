"""Numbers as the markdown tables of the reports show them; a missing figure (None, NaN) is ``-``.

Every report prints its tables with the peers measured in the same run side by side (ratios are
between peers of one run, never against a figure from another run or another file).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def _missing(x: float | None) -> bool:
    return x is None or x != x  # None or NaN


def num(x: float | None, digits: int = 2, thousands: bool = False) -> str:
    if x is None or _missing(x):
        return "-"
    return f"{x:,.{digits}f}" if thousands else f"{x:.{digits}f}"


def ms(seconds: float | None, digits: int = 1) -> str:
    """Seconds shown as milliseconds."""
    return "-" if seconds is None or _missing(seconds) else f"{seconds * 1000:.{digits}f}"


def mib(size: float, digits: int = 1) -> str:
    """Bytes shown as MiB."""
    return f"{size / 2**20:.{digits}f}"


def pct(share: float) -> str:
    """A share (0..1) shown as a whole percentage."""
    return f"{share * 100:.0f}%" if share == share else "-"


def ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    """``a / b`` as ``N.NNx``; ``-`` when either is missing or ``b`` is zero."""
    if a is None or b is None or _missing(a) or _missing(b) or not b:
        return "-"
    return f"{a / b:.{digits}f}x"


def per_round(ours: Sequence[float], theirs: Sequence[float]) -> str:
    """Median (lowest-highest) of the per-round ratios ours/theirs: two peers measured back to
    back in each round, so a drift of the machine's speed between rounds cancels out."""
    ratios = sorted(a / b for a, b in zip(ours, theirs, strict=False) if b)
    if not ratios:
        return "-"
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def met(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"
