"""The in-memory benchmark of kproxy's upstream clients (benchmarks/upstream_clients.py) drives
their internals directly (fake transports, frames fed to ``data_received``): a quick run, in its
own process, must measure every scenario on both clients (it raises when a LIST is not read
whole), or an interface change in the clients would leave it measuring nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_upstream_clients_quick_run() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.upstream_clients", "--quick"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (GET|LIST)[^|]* \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", done.stdout, re.M)
    assert len(rows) == 4, done.stdout
    assert all(float(h2) > 0 and float(h1) > 0 for _, h2, h1, _ in rows), rows
