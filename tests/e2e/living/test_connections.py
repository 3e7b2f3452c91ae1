"""Connections the living cluster holds through kproxy: as few as directly to the apiserver.

client-go speaks HTTP/2 to the apiserver, one connection per process carrying every request and
watch. Through kproxy (the recommended chain, TLS, HTTP/2 on both sides) the real
kube-controller-manager, kube-scheduler and KWOK hold at most two connections each to kproxy,
and kproxy at most four to the apiserver, while the controllers start, sync their informers and
roll a deployment out (through kproxy). Counted from each process's own sockets (/proc/PID/fd and
/proc/net/tcp*), sampled through the whole run; the largest count is the verdict.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from urllib.parse import urlsplit

from kproxy.localcluster.cluster import (
    component_pids,
    recommended_config,
    running_components,
    wait_nodes_ready,
)
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.sockets import tcp_connections

#: How long the counts are sampled once the nodes are ready (the controllers' informers start and
#: sync within it, and the rollout below runs in it).
WINDOW = 20.0


def test_controllers_hold_as_few_connections_as_to_the_apiserver(living: ControlPlaneInfo) -> None:
    with running_components(living, mode="proxied", proxy=recommended_config()) as server:
        kproxy_port = urlsplit(server).port
        assert kproxy_port is not None
        wait_nodes_ready(living, 3, timeout=120)
        pids = component_pids(living.dir)
        # The test's own kubectl goes direct: the counts are the components' alone.
        kubectl = [str(living.kubectl), f"--kubeconfig={living.admin_kubeconfig}", "-n", "default"]
        deploy = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "connections"},
            "spec": {
                "replicas": 5,
                "selector": {"matchLabels": {"app": "connections"}},
                "template": {
                    "metadata": {"labels": {"app": "connections"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        }
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(deploy), text=True, check=True)
        most: Counter[str] = Counter()
        start = time.monotonic()
        ready, checked = "", 0.0
        while time.monotonic() - start < WINDOW or ready != "5":
            assert time.monotonic() - start < 180, f"the rollout did not finish through kproxy ({ready!r} ready)"
            now = {
                name: tcp_connections(pids[name], remote_port=kproxy_port)[1]
                for name in ("kube-controller-manager", "kube-scheduler", "kwok")
            }
            now["kproxy"] = tcp_connections(pids["kproxy"], remote_port=living.apiserver_port)[1]
            for name, n in now.items():
                most[name] = max(most[name], n)
            if time.monotonic() - checked > 2:
                checked = time.monotonic()
                ready = subprocess.run(
                    [*kubectl, "get", "deployment", "connections", "-o", "jsonpath={.status.readyReplicas}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            time.sleep(0.25)  # the sampling interval of a measurement over the window
        subprocess.run([*kubectl, "delete", "deployment", "connections"], check=True, capture_output=True)
    print("largest connection counts:", dict(most))
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        assert 1 <= most[name] <= 2, f"{name} held {most[name]} connections to kproxy"
    assert 1 <= most["kproxy"] <= 4, f"kproxy held {most['kproxy']} connections to the apiserver"
