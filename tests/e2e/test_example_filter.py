"""The example third-party filter (examples/readonly-filter), loaded by kproxy from its entry point,
in front of the real apiserver, driven by kubectl."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from kproxy.localcluster.envtest import Kubectl
from kproxy.testing.proxyproc import RunningProxy


def test_readonly_filter_from_entry_point(
    proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    rp = proxy_factory(extra={"filters": [{"name": "readonly", "allow_namespaces": ["scratch-*"]}]})
    kubectl(["create", "configmap", "exists", "-n", namespace])
    # Reads pass through the chain.
    assert kubectl(["get", "cm", "exists", "-n", namespace, "-o", "name"], kubeconfig=rp.kubeconfig).stdout == (
        "configmap/exists\n"
    )
    # Writes are refused, and kubectl reports the Status like any apiserver denial (a create has no
    # name in its path, so, as with RBAC denials, the message names only the resource).
    res = kubectl(["create", "configmap", "new", "-n", namespace], kubeconfig=rp.kubeconfig, check=False)
    assert res.returncode == 1
    assert res.stderr == (
        "error: failed to create configmap: configmaps is forbidden: kproxy readonly filter: "
        "writes are allowed only in scratch-*\n"
    )
    assert "NotFound" in kubectl(["get", "cm", "new", "-n", namespace], check=False).stderr
    res = kubectl(["delete", "configmap", "exists", "-n", namespace], kubeconfig=rp.kubeconfig, check=False)
    assert 'Error from server (Forbidden): configmaps "exists" is forbidden: kproxy readonly filter' in res.stderr
    # The per-filter time is measured.
    assert 'kproxy_filter_duration_seconds_count{filter="readonly"}' in rp.metrics()


def test_check_config_prints_the_chain(tmp_path: pytest.TempPathFactory) -> None:
    cfg = tmp_path / "c.yaml"  # type: ignore[operator]
    cfg.write_text("filters:\n  - name: readonly\n    allow_namespaces: [a, b]\n")
    out = subprocess.run([sys.executable, "-m", "kproxy.cli", "check-config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "1. readonly {allow_namespaces: [a, b]}" in out.stdout
    cfg.write_text("filters:\n  - name: readonly\n    allow_namespace: [a]\n")
    out = subprocess.run([sys.executable, "-m", "kproxy.cli", "check-config", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "filters[0].allow_namespace: unknown key" in out.stderr
