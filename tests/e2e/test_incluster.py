"""In-cluster mode: with no kubeconfig, a real `kproxy run` uses the pod's service account.

The test lays out what the kubelet gives a pod: ``KUBERNETES_SERVICE_HOST``/``PORT`` and a
service-account directory (token, ca.crt, namespace) written the way the kubelet's atomic
writer does it (``..data`` symlink to a timestamped directory, swapped on every rotation). The
token is a real one from the control plane's TokenRequest API, bound to a Secret, so deleting
the Secret revokes it: kproxy must then pick up the rotated file to keep working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

SA = "kproxy-incluster"


def _write_atomically(sa_dir: Path, files: dict[str, str]) -> None:
    """The kubelet's AtomicWriter layout: files are symlinks through ``..data``, which is swapped
    in one rename to a fresh timestamped directory (so a reader never sees half a token)."""
    sa_dir.mkdir(parents=True, exist_ok=True)
    stamp = sa_dir / f"..{time.time_ns()}"
    stamp.mkdir()
    for name, text in files.items():
        (stamp / name).write_text(text)
    tmp_link = sa_dir / "..data_tmp"
    tmp_link.symlink_to(stamp.name)
    old = (sa_dir / "..data").resolve() if (sa_dir / "..data").is_symlink() else None
    os.replace(tmp_link, sa_dir / "..data")
    for name in files:
        link = sa_dir / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old is not None:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()


def _token_bound_to_secret(kubectl: Kubectl, namespace: str, secret: str) -> str:
    kubectl(["create", "secret", "generic", secret, "-n", namespace, "--from-literal=k=v"])
    out = kubectl(
        [
            "create",
            "token",
            SA,
            "-n",
            namespace,
            "--duration=1h",
            "--bound-object-kind=Secret",
            f"--bound-object-name={secret}",
        ]
    )
    return out.stdout.strip()


def _whoami(proxy: RunningProxy, kubectl: Kubectl) -> tuple[int, str]:
    """kubectl auth whoami through kproxy: (exit code, username or stderr)."""
    out = kubectl(["auth", "whoami", "-o", "json"], kubeconfig=proxy.kubeconfig, check=False)
    if out.returncode != 0:
        return out.returncode, out.stderr
    return 0, json.loads(out.stdout)["status"]["userInfo"]["username"]


@pytest.fixture
def service_account(kubectl: Kubectl, namespace: str) -> str:
    """A service account that may read ConfigMaps in the test namespace, and nothing else."""
    kubectl(["create", "serviceaccount", SA, "-n", namespace])
    kubectl(["create", "role", "read-cm", "-n", namespace, "--verb=get,list,watch", "--resource=configmaps"])
    kubectl(
        ["create", "rolebinding", "read-cm", "-n", namespace, "--role=read-cm", f"--serviceaccount={namespace}:{SA}"]
    )
    return f"system:serviceaccount:{namespace}:{SA}"


def _pod_env(control_plane: ControlPlaneInfo, sa_dir: Path) -> dict[str, str]:
    return {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
        "KPROXY_SERVICE_ACCOUNT_DIR": str(sa_dir),
        # No ~/.kube/config either: in-cluster must win on its own (it comes before the home file).
        "HOME": str(sa_dir.parent),
    }


def test_incluster_serves_as_the_service_account_and_follows_rotation(
    control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, service_account: str, tmp_path: Path
) -> None:
    sa_dir = tmp_path / "serviceaccount"
    token1 = _token_bound_to_secret(kubectl, namespace, "bound-1")
    _write_atomically(sa_dir, {"token": token1, "ca.crt": control_plane.ca_file.read_text(), "namespace": namespace})
    kubectl(["create", "configmap", "visible", "-n", namespace, "--from-literal=a=b"])

    proxy = start_proxy(tmp_path / "kproxy", None, env=_pod_env(control_plane, sa_dir))
    try:
        assert "in-cluster" in proxy.log_text()
        # Every request goes upstream as the service account: its identity, its RBAC.
        assert _whoami(proxy, kubectl) == (0, service_account)
        names = kubectl(["get", "configmaps", "-n", namespace, "-o", "name"], kubeconfig=proxy.kubeconfig)
        assert "configmap/visible" in names.stdout.split()
        denied = kubectl(["get", "secrets", "-n", namespace], kubeconfig=proxy.kubeconfig, check=False)
        assert denied.returncode != 0
        assert f'User "{service_account}" cannot list resource "secrets"' in denied.stderr

        # Revoke the first token: kproxy, still holding it, is now rejected by the apiserver.
        kubectl(["delete", "secret", "bound-1", "-n", namespace])
        eventually(lambda: _whoami(proxy, kubectl)[0] != 0, 30, "the revoked token to be refused")
        code, err = _whoami(proxy, kubectl)
        assert code != 0
        assert "(Unauthorized)" in err, err

        # The kubelet rotates the file; kproxy re-reads it without a restart.
        token2 = _token_bound_to_secret(kubectl, namespace, "bound-2")
        assert token2 != token1
        _write_atomically(
            sa_dir, {"token": token2, "ca.crt": control_plane.ca_file.read_text(), "namespace": namespace}
        )
        eventually(lambda: _whoami(proxy, kubectl) == (0, service_account), 30, "the rotated token to be used")
        assert proxy.proc.poll() is None
    finally:
        proxy.stop()


def test_incluster_with_python_client(
    control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, service_account: str, tmp_path: Path
) -> None:
    """The official Python client through an in-cluster kproxy: allowed and denied as the SA."""
    from kubernetes import client, config

    sa_dir = tmp_path / "serviceaccount"
    token = _token_bound_to_secret(kubectl, namespace, "bound")
    _write_atomically(sa_dir, {"token": token, "ca.crt": control_plane.ca_file.read_text(), "namespace": namespace})
    kubectl(["create", "configmap", "visible", "-n", namespace, "--from-literal=a=b"])
    proxy = start_proxy(tmp_path / "kproxy", None, env=_pod_env(control_plane, sa_dir))
    try:
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(proxy.kubeconfig)))
        items = api.list_namespaced_config_map(namespace).items
        assert "visible" in [cm.metadata.name for cm in items]
        with pytest.raises(client.ApiException) as denied:
            api.list_namespaced_secret(namespace)
        assert denied.value.status == 403
        assert json.loads(denied.value.body)["message"].startswith(f'secrets is forbidden: User "{service_account}"')
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}, "no service-account token at"),
        ({"KUBERNETES_SERVICE_HOST": "127.0.0.1"}, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"),
    ],
)
def test_incluster_misconfigured_pod_fails_with_a_message(tmp_path: Path, env: dict[str, str], message: str) -> None:
    """A pod without its token (automount off, no projected volume) or without the service env:
    kproxy exits at start-up with a one-line reason, never a traceback."""
    sa_dir = tmp_path / "empty-sa"
    sa_dir.mkdir()
    cfg = tmp_path / "kproxy.yaml"
    cfg.write_text("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_") and k != "KUBECONFIG"}
    proc = subprocess.run(
        [sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg)],
        env={**base, **env, "KPROXY_SERVICE_ACCOUNT_DIR": str(sa_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert message in output
    assert "Traceback" not in output
