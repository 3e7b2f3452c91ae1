"""The in-memory benchmark of kproxy's upstream clients (benchmarks/upstream_clients.py) drives
their internals directly (fake transports, frames fed to ``data_received``): a quick run, in its
own process, must measure every scenario on both clients (it raises when a LIST is not read
whole), or an interface change in the clients would leave it measuring nothing."""

from __future__ import annotations

import re

from kproxy.testing.benchrun import run_benchmark


def test_upstream_clients_quick_run() -> None:
    done = run_benchmark("upstream_clients", ["--quick"], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| (GET|LIST)[^|]* \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", done.stdout, re.M)
    assert len(rows) == 4, done.stdout
    assert all(float(h2) > 0 and float(h1) > 0 for _, h2, h1, _ in rows), rows
