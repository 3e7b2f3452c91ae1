"""The local control plane itself: right release, working admin, a forbidden user, outage/recovery.

The first group needs no binaries: it checks down/status bookkeeping against
stand-in processes (``sleep``), because ``down`` must never leave processes
behind nor signal a process it did not start.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from kproxy.localcluster import envtest

# --------------------------------------------------------------------------- bookkeeping (no binaries)


def _fake_state(directory: Path, etcd: list[str], apiserver: list[str]) -> envtest._State:
    """Record two detached stand-in processes in ``directory`` the way up() records etcd/apiserver."""
    directory.mkdir(parents=True, exist_ok=True)
    state = envtest._State(
        version="v0.0.0",
        kubectl="/nonexistent/kubectl",
        apiserver_port=1,  # nothing listens there: readyz must be False
        etcd_client_port=2,
        etcd_peer_port=3,
        user_token="u",
        admin_token="a",
    )
    pid, start = envtest._spawn(etcd, directory / "etcd.log", directory)
    state.etcd = envtest._ProcState(pid, start, etcd)
    pid, start = envtest._spawn(apiserver, directory / "apiserver.log", directory)
    state.apiserver = envtest._ProcState(pid, start, apiserver)
    envtest._write_state(directory, state)
    return state


def _gone(pid: int) -> bool:
    """True once ``pid`` no longer exists or is a zombie (not reaped because not our child)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_down_and_status_without_state_are_noops(tmp_path: Path) -> None:
    assert envtest.down(tmp_path) is False
    st = envtest.status(tmp_path)
    assert not st.has_state and not st.up
    assert envtest.main(["status", "--dir", str(tmp_path)]) == 1


def test_down_stops_whole_process_groups_and_forgets_state(tmp_path: Path) -> None:
    # The "apiserver" forks a grandchild: killing only the leader would leak it.
    grandchild_pidfile = tmp_path / "grandchild.pid"
    state = _fake_state(
        tmp_path,
        ["sleep", "300"],
        ["sh", "-c", f"sleep 300 & echo $! > {grandchild_pidfile}; wait"],
    )
    deadline = time.monotonic() + 10
    while not grandchild_pidfile.exists() or not grandchild_pidfile.read_text().strip():
        assert time.monotonic() < deadline, "stand-in did not start"
        time.sleep(0.05)
    grandchild = int(grandchild_pidfile.read_text())

    st = envtest.status(tmp_path)
    assert st.has_state and st.etcd_alive and st.apiserver_alive
    assert not st.ready and not st.up  # processes alone do not make a control plane

    assert envtest.down(tmp_path) is True
    assert state.etcd and state.etcd.pid and _gone(state.etcd.pid)
    assert state.apiserver and state.apiserver.pid and _gone(state.apiserver.pid)
    deadline = time.monotonic() + 10
    while not _gone(grandchild):
        assert time.monotonic() < deadline, "grandchild survived down()"
        time.sleep(0.05)
    assert not (tmp_path / "state.json").exists()
    assert envtest.down(tmp_path) is False  # idempotent


def test_down_escalates_to_sigkill(tmp_path: Path) -> None:
    stubborn = ["sh", "-c", "trap '' TERM; sleep 300"]  # the ignored TERM is inherited by sleep
    state = _fake_state(tmp_path, stubborn, stubborn)
    started = time.monotonic()
    assert envtest.down(tmp_path, grace=0.5) is True
    assert time.monotonic() - started < 10
    assert state.etcd and state.etcd.pid and _gone(state.etcd.pid)
    assert state.apiserver and state.apiserver.pid and _gone(state.apiserver.pid)


def test_down_never_signals_a_reused_pid(tmp_path: Path) -> None:
    """A stale state.json whose pid now belongs to another process (here: us) must not kill it."""
    state = _fake_state(tmp_path, ["true"], ["true"])
    assert state.etcd is not None and state.apiserver is not None
    for proc in (state.etcd, state.apiserver):
        assert proc.pid is not None
        envtest._CHILDREN[proc.pid].wait(timeout=10)  # reap the stand-ins before faking reuse
    state.etcd.pid, state.etcd.start_time = os.getpid(), "0"
    state.apiserver.pid, state.apiserver.start_time = os.getpid(), "0"
    envtest._write_state(tmp_path, state)
    st = envtest.status(tmp_path)
    assert not st.etcd_alive and not st.apiserver_alive
    assert envtest.down(tmp_path) is True  # we are still here to assert it
    assert not (tmp_path / "state.json").exists()


def test_corrupt_state_is_dropped_by_down(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    assert not envtest.status(tmp_path).has_state
    assert envtest.down(tmp_path) is False
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    ("go_mod", "expected"),
    [
        ("module m\n\nrequire (\n\tk8s.io/kubernetes v1.37.1 // indirect\n)\n", "v1.37.1"),
        ("module m\nrequire k8s.io/kubernetes v1.30.2\n", "v1.30.2"),
        (
            "module m\nrequire (\n\tk8s.io/kubernetes v1.30.2\n)\n"
            "replace k8s.io/kubernetes => k8s.io/kubernetes v1.30.3\n",
            "v1.30.3",
        ),
        (
            "module m\nrequire k8s.io/kubernetes v1.30.2\nreplace (\n\tk8s.io/kubernetes => ../kubernetes\n)\n",
            "v1.30.2",
        ),
        # A mention inside a comment or as a prefix of another module must not count.
        (
            "module m\n// k8s.io/kubernetes v9.9.9\nrequire (\n\tk8s.io/kubernetes-x v1.0.0\n"
            "\tk8s.io/kubernetes v1.31.0-rc.1\n)\n",
            "v1.31.0-rc.1",
        ),
    ],
)
def test_k8s_version_parses_go_mod(tmp_path: Path, go_mod: str, expected: str) -> None:
    path = tmp_path / "go.mod"
    path.write_text(go_mod)
    assert envtest.k8s_version(path) == expected


def test_k8s_version_missing_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "go.mod"
    path.write_text("module m\nrequire k8s.io/api v0.30.0\n")
    with pytest.raises(envtest.EnvtestError):
        envtest.k8s_version(path)


def test_k8s_version_of_the_repo_pin() -> None:
    assert re.fullmatch(r"v1\.\d+\.\d+", envtest.k8s_version())


# --------------------------------------------------------------------------- the real control plane


def test_server_and_kubectl_are_the_pinned_release(
    control_plane: envtest.ControlPlaneInfo, kubectl: envtest.Kubectl
) -> None:
    versions = kubectl.json(["version"])
    pin = envtest.k8s_version()
    assert versions["serverVersion"]["gitVersion"] == pin
    assert versions["clientVersion"]["gitVersion"] == pin
    assert control_plane.version == pin


def test_admin_creates_and_reads_a_configmap(kubectl: envtest.Kubectl, namespace: str) -> None:
    kubectl(["create", "configmap", "greeting", "-n", namespace, "--from-literal=hello=world"])
    cm = kubectl.json(["get", "configmap", "greeting", "-n", namespace])
    assert cm["data"] == {"hello": "world"}
    assert cm["metadata"]["namespace"] == namespace


def test_user_is_authenticated_but_has_no_rbac(
    control_plane: envtest.ControlPlaneInfo, kubectl: envtest.Kubectl, namespace: str
) -> None:
    who = kubectl.json(["auth", "whoami"], kubeconfig=control_plane.user_kubeconfig)
    assert who["status"]["userInfo"]["username"] == "kproxy-user"
    assert "system:authenticated" in who["status"]["userInfo"]["groups"]
    assert "system:masters" not in who["status"]["userInfo"]["groups"]

    denied = kubectl(["get", "pods", "-n", namespace], kubeconfig=control_plane.user_kubeconfig, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr and '"kproxy-user"' in denied.stderr

    code, body = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods", token=control_plane.user_token)
    assert code == 403
    assert json.loads(body)["reason"] == "Forbidden"


def test_unknown_token_is_unauthorized(control_plane: envtest.ControlPlaneInfo) -> None:
    code, _ = control_plane.request("GET", "/api/v1/namespaces", token="not-a-token")
    assert code == 401


def test_admin_token_is_cluster_admin(control_plane: envtest.ControlPlaneInfo) -> None:
    code, body = control_plane.request("GET", "/api/v1/namespaces", token=control_plane.admin_token)
    assert code == 200
    assert any(ns["metadata"]["name"] == "default" for ns in json.loads(body)["items"])


def test_status_reports_up(control_plane: envtest.ControlPlaneInfo, capsys: pytest.CaptureFixture[str]) -> None:
    st = envtest.status(control_plane.dir)
    assert st.up
    assert st.server == control_plane.server
    assert st.apiserver_pid == control_plane.apiserver_pid
    assert st.admin_kubeconfig == control_plane.admin_kubeconfig
    assert envtest.main(["status", "--dir", str(control_plane.dir)]) == 0
    assert capsys.readouterr().out.startswith("up ")


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_apiserver_outage_and_recovery_on_the_same_port(
    control_plane: envtest.ControlPlaneInfo, kubectl: envtest.Kubectl, namespace: str
) -> None:
    kubectl(["create", "configmap", "survivor", "-n", namespace])
    old_pid, port = control_plane.apiserver_pid, control_plane.apiserver_port
    try:
        control_plane.stop_apiserver(kill=True)
        assert control_plane.apiserver_pid is None
        assert _refused(port)
        st = envtest.status(control_plane.dir)
        assert st.etcd_alive and not st.apiserver_alive and not st.up
    finally:
        control_plane.start_apiserver()
    assert control_plane.apiserver_pid not in (None, old_pid)
    assert control_plane.apiserver_port == port and control_plane.readyz()
    assert envtest.status(control_plane.dir).up
    # etcd kept the data across the outage.
    assert kubectl.json(["get", "configmap", "survivor", "-n", namespace])["metadata"]["name"] == "survivor"


def test_bin_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``$KPROXY_ENVTEST_BIN_DIR`` is taken as is (never built into) but must be complete."""
    monkeypatch.setenv(envtest.BIN_DIR_ENV, str(tmp_path))
    with pytest.raises(envtest.EnvtestError, match="lacks executables"):
        envtest.ensure_binaries()
    for name in envtest.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    (tmp_path / "VERSION").write_text("v1.2.3\n")
    bins = envtest.ensure_binaries()
    assert bins.kube_apiserver == tmp_path / "kube-apiserver" and bins.version == "v1.2.3"


def test_admin_kubeconfig_works_with_the_official_python_client(
    control_plane: envtest.ControlPlaneInfo,
) -> None:
    from kubernetes import client, config

    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(control_plane.admin_kubeconfig)
    )
    try:
        items = client.CoreV1Api(api_client).list_namespace().items
    finally:
        api_client.close()
    assert "default" in {ns.metadata.name for ns in items if ns.metadata}


def test_failed_up_reports_the_log_and_leaves_nothing_running(
    control_plane: envtest.ControlPlaneInfo, tmp_path: Path
) -> None:
    """A broken apiserver: up() raises with its log tail, and stops the etcd it had started."""
    real = envtest.BinPaths.in_dir(control_plane.kubectl.parent)
    broken = tmp_path / "bin" / "kube-apiserver"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'E0000 simulated: flag provided but not defined' >&2\nexit 1\n")
    broken.chmod(0o755)
    bins = envtest.BinPaths(real.dir, real.etcd, broken, real.kubectl, real.version)
    cp_dir = tmp_path / "cp"
    with pytest.raises(envtest.ControlPlaneError, match="(?s)kube-apiserver exited.*simulated: flag provided"):
        envtest.up(cp_dir, bins=bins, timeout=60)
    assert not (cp_dir / "state.json").exists()
    etcd_argv_marker = f"--data-dir={cp_dir / 'etcd'}"
    deadline = time.monotonic() + 10
    while any(etcd_argv_marker in cmd for cmd in _cmdlines()):
        assert time.monotonic() < deadline, "etcd left running"
        time.sleep(0.05)


def _cmdlines() -> list[str]:
    """Command lines of live (non-zombie) processes."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if cmd:
                out.append(cmd)
    return out
