"""Hot reload against the real apiserver: a changed config file or SIGHUP swaps the chain while a
watch opened before the reload stays open and keeps delivering; a bad config is refused and the
running one kept; settings that need a restart are reported, not half-applied."""

from __future__ import annotations

import http.client
import json
import queue
import re
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from kproxy.localcluster.envtest import Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def _reloads(rp: RunningProxy, result: str) -> float:
    m = re.search(rf'^kproxy_config_reloads_total{{result="{result}"}} (\S+)$', rp.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


class Watch:
    """A raw watch through kproxy, read line by line on a thread."""

    def __init__(self, rp: RunningProxy, path: str) -> None:
        host, port = rp.url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.request("GET", path)
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.resp:
                self.events.put(json.loads(line))
        except Exception:  # the test shut the socket down; http.client reports that in several ways
            pass
        self.events.put(None)  # the stream ended

    def next_named(self, name: str, timeout: float = 20) -> dict[str, Any]:
        while True:
            ev = self.events.get(timeout=timeout)
            assert ev is not None, "the watch ended"
            if ev["object"]["metadata"]["name"] == name:
                return ev

    def close(self) -> None:
        # Shut the socket down first: closing the response under the reading thread would wait for it.
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def test_reload_swaps_chain_and_keeps_watches(
    proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    rp = proxy_factory(
        extra={"reload_interval": "200ms", "filters": [{"name": "readonly", "allow_namespaces": ["elsewhere"]}]}
    )
    kc = rp.kubeconfig
    watch = Watch(rp, f"/api/v1/namespaces/{namespace}/configmaps?watch=true")
    try:
        refused = kubectl(["create", "cm", "before", "-n", namespace], kubeconfig=kc, check=False)
        assert refused.returncode == 1 and "forbidden" in refused.stderr

        # The file changes (atomically, as a ConfigMap volume does): the new chain allows writes here.
        rp.write_config({"filters": [{"name": "readonly", "allow_namespaces": [namespace]}]})
        eventually(lambda: _reloads(rp, "success") == 1, 20, "the file change to be reloaded")
        kubectl(["create", "cm", "after", "-n", namespace], kubeconfig=kc)
        # The watch opened before the reload is still open and sees the write made after it.
        assert watch.next_named("after")["type"] == "ADDED"

        # An invalid config is refused: logged, counted, and the running chain stays.
        rp.write_config({"filters": [{"name": "readonly", "allow_namespace": ["typo"]}]})
        eventually(lambda: _reloads(rp, "failure") == 1, 20, "the bad config to be refused")
        assert "filters[0].allow_namespace: unknown key" in rp.log_text()
        kubectl(["create", "cm", "still-allowed", "-n", namespace], kubeconfig=kc)
        assert watch.next_named("still-allowed")["type"] == "ADDED"

        # SIGHUP reloads too (here the filter is removed), and restart-only keys are reported.
        with_listen = dict(rp.config, filters=[], listen="127.0.0.1:1")
        assert rp.config_path is not None
        rp.config_path.write_text(json.dumps(with_listen))  # JSON is YAML
        rp.config = with_listen
        rp.proc.send_signal(signal.SIGHUP)
        eventually(lambda: _reloads(rp, "success") == 2, 20, "the SIGHUP reload")
        assert "these settings change only on restart" in rp.log_text()
        assert '"keys":["listen"]' in rp.log_text()
        kubectl(["create", "cm", "anywhere", "-n", namespace], kubeconfig=kc)  # still on the old port
        assert watch.next_named("anywhere")["type"] == "ADDED"
        assert rp.proc.poll() is None
    finally:
        watch.close()
