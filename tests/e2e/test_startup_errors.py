"""Start-up failures as an operator meets them: one line naming the key, exit code 2, nothing else.

An upstream that does not answer is not a start-up failure (a sidecar must not crash-loop while its
apiserver restarts): kproxy says so once, serves, and reports not ready.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import free_ports


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_") and k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "kproxy.cli", "run", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_listen_port_in_use_is_one_line(control_plane: ControlPlaneInfo, busy_port: int) -> None:
    (admin,) = free_ports(1)
    out = run(
        "--kubeconfig", str(control_plane.admin_kubeconfig),
        "--listen", f"127.0.0.1:{busy_port}", "--admin-listen", f"127.0.0.1:{admin}",
    )  # fmt: skip
    assert out.returncode == 2
    assert (
        out.stderr == f"kproxy: config error: listen: cannot listen on 127.0.0.1:{busy_port}: address already in use\n"
    )


def test_admin_port_in_use_is_one_line(control_plane: ControlPlaneInfo, busy_port: int) -> None:
    (listen,) = free_ports(1)
    out = run(
        "--kubeconfig", str(control_plane.admin_kubeconfig),
        "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{busy_port}",
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == (
        f"kproxy: config error: admin_listen: cannot listen on 127.0.0.1:{busy_port}: address already in use\n"
    )


def test_missing_exec_plugin_names_it_with_the_install_hint(tmp_path: Path) -> None:
    kc = tmp_path / "kc.yaml"
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "kproxy-test-no-such-auth-plugin",
        "installHint": "Install it from https://example.com/plugin",
    }
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"exec": exec_}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    out = run("--kubeconfig", str(kc))
    assert out.returncode == 2
    assert out.stderr == (
        "kproxy: config error: exec: executable kproxy-test-no-such-auth-plugin not found (a client-go credential "
        "plugin the kubeconfig names is not installed): Install it from https://example.com/plugin\n"
    )


def test_tls_certificate_that_cannot_be_read_is_one_line(control_plane: ControlPlaneInfo, tmp_path: Path) -> None:
    listen, admin = free_ports(2)
    cfg = tmp_path / "c.yaml"
    missing = tmp_path / "no.crt"
    cfg.write_text(
        yaml.safe_dump({"credentials": "forward", "tls": {"cert_file": str(missing), "key_file": str(missing)}})
    )
    out = run(
        "--config", str(cfg), "--kubeconfig", str(control_plane.admin_kubeconfig),
        "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}",
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == f"kproxy: config error: tls: cannot load {missing} and its key: no such file or directory\n"


def test_unreachable_upstream_is_said_once_and_served(control_plane: ControlPlaneInfo, tmp_path: Path) -> None:
    (dead,) = free_ports(1)  # nothing listens there
    kc = tmp_path / "kc.yaml"
    doc = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{dead}"
    kc.write_text(yaml.safe_dump(doc))
    listen, admin = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_") and k != "KUBECONFIG"}
    log = tmp_path / "log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kproxy.cli", "run", "--kubeconfig", str(kc),
             "--listen", f"127.0.0.1:{listen}", "--admin-listen", f"127.0.0.1:{admin}"],
            stdout=f, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "is not ready" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        text = log.read_text()
        assert f"the upstream kube-apiserver https://127.0.0.1:{dead} is not ready" in text
        assert text.count("is not ready") == 1
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5)
        assert err.value.code == 503
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        proc.wait(30)
