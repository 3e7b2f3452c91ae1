"""The in-memory benchmark of kproxy's HTTP/1.1 request reader (benchmarks/request_reader.py)
drives the listener's reader directly: a quick run, in its own process, must read every request
of every scenario both ways (it raises when one is not), or an interface change in the reader
would leave it measuring nothing."""

from __future__ import annotations

import re

from kproxy.testing.benchrun import run_benchmark


def test_request_reader_quick_run() -> None:
    done = run_benchmark("request_reader", ["--quick"], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^\| ([^|]+) \| ([\d.]+|refuses) \| ([\d.]+) \| (-?[\d.]+|-) \|$", done.stdout, re.M)
    assert len(rows) == 7, done.stdout
    assert all(float(ours) > 0 for _, _, ours, _ in rows), rows
    assert [name for name, alone, _, _ in rows if alone == "refuses"] == ["a head of 262,000 folded lines"], rows
