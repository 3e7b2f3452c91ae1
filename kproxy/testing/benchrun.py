"""Running a benchmark of ``benchmarks/`` from a test: a quick run in its own process, from the
checkout's root (``benchmarks`` is not an installed package)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The checkout holding ``kproxy/`` and ``benchmarks/``.
ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(module: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> <argv>``, its output captured; never raises for its exit."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
