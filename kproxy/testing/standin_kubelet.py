"""A stand-in kubelet for end-to-end exec, attach and port-forward through the real kube-apiserver.

No kubelet runs here, so the apiserver has nowhere to proxy ``pods/exec``, ``pods/attach`` and
``pods/portforward`` to. ``standin-kubelet`` (tools/envtest/standin-kubelet, built next to
kubectl) serves the kubelet's URL shapes with the kubelet's own streaming code: exec runs the
command as a local process, attach runs a fixed command per container name, port-forward connects
to ``127.0.0.1:<port>``. :class:`StandInNode` starts it, registers a Node whose kubelet endpoint it
is (InternalIP 127.0.0.1, ``daemonEndpoints.kubeletEndpoint.Port``) and creates pods bound to that
Node (``spec.nodeName``, phase Running: kubectl refuses to port-forward to a pod that is not).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kproxy.localcluster.binaries import ensure_standin_kubelet
from kproxy.localcluster.controlplane import ControlPlaneInfo
from kproxy.testing.eventually import eventually

__all__ = ["StandInNode"]

_LISTENING = re.compile(rb"^listening on 127\.0\.0\.1:(\d+)$", re.M)


class StandInNode:
    """The stand-in kubelet process and the Node that points at it; :meth:`close` undoes both."""

    def __init__(self, cp: ControlPlaneInfo, tmp: Path, *, attach: Mapping[str, str] | None = None) -> None:
        self.cp = cp
        self.log = tmp / "standin-kubelet.log"
        argv = [str(ensure_standin_kubelet()), "-listen", "127.0.0.1:0"]
        for container, command in (attach or {}).items():
            argv += ["-attach", f"{container}={command}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.port = 0
        self.node = f"stand-in-{secrets.token_hex(3)}"
        self.namespaces: list[str] = []
        try:
            eventually(self._listening, 30, "standin-kubelet to listen")
            self._register()
        except BaseException:
            self.close()
            raise

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"standin-kubelet exited with {self.proc.returncode}:\n{self.log_text()}")
        if m := _LISTENING.search(self.log.read_bytes()):
            self.port = int(m.group(1))
        return self.port != 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def _register(self) -> None:
        code, body = self.cp.request("POST", "/api/v1/nodes", body=_doc("Node", self.node))
        assert code == 201, body[:300]
        status = {
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            }
        }
        self._merge_status(f"/api/v1/nodes/{self.node}/status", status)

    def _merge_status(self, path: str, patch: dict[str, Any]) -> None:
        code, body = self.cp.request(
            "PATCH", path, body=json.dumps(patch).encode(), content_type="application/merge-patch+json"
        )
        assert code == 200, body[:300]

    def namespace(self, prefix: str) -> str:
        """A fresh namespace (deleted by :meth:`close`)."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        code, body = self.cp.request("POST", "/api/v1/namespaces", body=_doc("Namespace", name))
        assert code == 201, body[:300]
        self.namespaces.append(name)
        return name

    def pod(self, namespace: str, name: str, containers: Sequence[Mapping[str, Any]]) -> None:
        """A pod bound to this Node, its containers given as in ``spec.containers`` (``image`` defaulted)."""
        spec = {"nodeName": self.node, "containers": [{"image": "stand-in", **c} for c in containers]}
        code, body = self.cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=_doc("Pod", name, spec=spec))
        assert code == 201, body[:300]
        self._merge_status(f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {"phase": "Running"}})

    def close(self) -> None:
        for ns in self.namespaces:
            self.cp.request("DELETE", f"/api/v1/namespaces/{ns}")
        self.namespaces.clear()
        if self.port:
            self.cp.request("DELETE", f"/api/v1/nodes/{self.node}")
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _doc(kind: str, name: str, **extra: Any) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, **extra}).encode()
