"""The watch fan-out benchmark (benchmarks/fanout_engine.py) still runs against kproxy's current
fan-out path: a tiny run, in its own process (it raises its file limit and starts client
processes), must deliver events through both peers. It drives kproxy's internals directly, so an
interface change there breaks it without any other test noticing (it once did: the watch
starter gained a coding argument)."""

from __future__ import annotations

import re

from kproxy.testing.benchrun import run_benchmark


def test_fanout_engine_tiny_run() -> None:
    argv = ["--watchers", "20", "--rate", "200", "--batches", "2", "--sizes", "300", "--duration", "0.5"]
    done = run_benchmark("fanout_engine", [*argv, "--procs", "1"], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| 300 \| 2 \| (raw|kproxy) \| ([\d,]+) \|.*\| ([\d.]+) \| ([\d.]+) \|$", done.stdout, re.M)
    assert {r[0] for r in rows} == {"raw", "kproxy"}, done.stdout
    for peer, deliveries, received_mb, _per_write in rows:
        assert int(deliveries.replace(",", "")) > 0 and float(received_mb) > 0, (peer, done.stdout)
