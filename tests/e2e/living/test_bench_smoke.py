"""The control-plane load benchmark (benchmarks/controlplane.py) still runs and produces its table.

``--quick`` on the living control plane: both sides (the real components direct, then through kproxy's
recommended chain) churn two small Deployments. The run must end cleanly (no step timed out, no failed
request), and the report must hold both sides' rows with every rollout measured, and the watch table
with kproxy holding at most one apiserver watch of pods (a measurement read from the apiserver's own
/metrics, so a benchmark that silently stopped measuring would show here).
"""

from __future__ import annotations

import re
from pathlib import Path

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.benchrun import run_benchmark

#: --quick: 2 Deployments x 5 steps
ROLLOUTS = 10


def test_quick_run_produces_the_table(living: ControlPlaneInfo, tmp_path: Path) -> None:
    out = tmp_path / "controlplane.md"
    argv = ["--quick", "--envtest-dir", str(living.dir), "--output", str(out)]
    done = run_benchmark("controlplane", argv, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text in done.stdout
    rows = dict(re.findall(r"^\| (direct|kproxy) \| (\d+) \| [\d.]+ \| [\d.]+ \|", text, re.M))
    assert rows == {"direct": str(ROLLOUTS), "kproxy": str(ROLLOUTS)}, text
    pods = re.search(r"^\| pods \* \| (\d+) \| (\d+) \|$", text, re.M)
    assert pods is not None, text
    direct, proxied = int(pods[1]), int(pods[2])
    # Direct: the controller-manager, the scheduler and kwok each watch pods; through kproxy one watch.
    assert direct >= 3 and proxied == 1, text
    assert "failure" not in text, text
