"""Starting, stopping and inspecting a control plane in a directory: ``up``, ``down``, ``status``.

Layout of a control-plane directory (``up(DIR)``)::

    DIR/state.json          pids, ports, argv, tokens (0600): the source of truth for down/status
    DIR/ca.crt ...          PKI from kproxy.localcluster.certs
    DIR/tokens.csv          static bearer tokens (--token-auth-file)
    DIR/admin.kubeconfig    client-cert user in system:masters
    DIR/user.kubeconfig     bearer-token user "kproxy-user" without any RBAC binding
    DIR/etcd/               etcd data (wiped on every up: each up is a fresh cluster)
    DIR/etcd.log, DIR/apiserver.log
    DIR/kproxy.yaml, DIR/<component>.kubeconfig, DIR/<component>.log   the living cluster (kproxy.localcluster.cluster)
"""

from __future__ import annotations

import http.client
import json
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kproxy.localcluster import certs
from kproxy.localcluster.binaries import BinPaths, ensure_binaries
from kproxy.localcluster.cluster import COMPONENTS, component_tokens, token_lines
from kproxy.localcluster.controlplane import USER_NAME, ControlPlaneInfo, _failure, _info, _wait_apiserver
from kproxy.localcluster.errors import ControlPlaneError
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.localcluster.processes import (
    _POLL_INTERVAL,
    _file_size,
    _port_clash_since,
    _spawn,
    _terminate,
    free_ports,
)
from kproxy.localcluster.state import (
    _STATE_FILE,
    _dir_lock,
    _ProcState,
    _read_state,
    _remove_state,
    _State,
    _write_state,
)

__all__ = ["ControlPlaneStatus", "down", "status", "up"]

USER_UID = "kproxy-user-uid"
ADMIN_TOKEN_USER = "kproxy-admin-token"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
#: Truncated by up(); their names match ControlPlaneInfo.etcd_log / apiserver_log.
_LOGS = ("etcd.log", "apiserver.log")


def _etcd_healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        return resp.status == 200 and json.loads(body).get("health") == "true"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _wait_etcd(info: ControlPlaneInfo, proc: _ProcState, deadline: float) -> None:
    while not _etcd_healthy(info.etcd_client_port):
        if not proc.alive():
            raise _failure("etcd exited during startup", info, [info.etcd_log])
        if time.monotonic() > deadline:
            raise _failure(f"etcd not healthy on {info.etcd_url} in time", info, [info.etcd_log])
        time.sleep(_POLL_INTERVAL)


def _etcd_argv(bins: BinPaths, directory: Path, client: int, peer: int) -> list[str]:
    peer_url = f"http://127.0.0.1:{peer}"
    client_url = f"http://127.0.0.1:{client}"
    return [
        str(bins.etcd),
        "--name=envtest",
        f"--data-dir={directory / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=envtest={peer_url}",
        "--initial-cluster-state=new",
        # Test data is disposable; skipping fsync makes writes (and startup) much faster.
        "--unsafe-no-fsync=true",
    ]


def _apiserver_argv(bins: BinPaths, directory: Path, pki: certs.PKIFiles, port: int, etcd_client: int) -> list[str]:
    return [
        str(bins.kube_apiserver),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--etcd-servers=http://127.0.0.1:{etcd_client}",
        f"--cert-dir={directory}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        "--authorization-mode=RBAC",
        f"--token-auth-file={directory / 'tokens.csv'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        # No controller-manager creates default ServiceAccounts, so this plugin would reject every pod.
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        # 127.0.0.1 may not appear in Endpoints; without this the apiserver logs a reconcile error
        # every few seconds (k8s' own test server sets the same).
        "--endpoint-reconciler-type=none",
    ]


def _start(
    directory: Path, bins: BinPaths, pki: certs.PKIFiles, state: _State, deadline: float, extra: Sequence[str] = ()
) -> ControlPlaneInfo:
    info = _info(directory, state)
    data = directory / "etcd"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(mode=0o700)
    etcd_argv = _etcd_argv(bins, directory, state.etcd_client_port, state.etcd_peer_port)
    pid, start = _spawn(etcd_argv, info.etcd_log, directory)
    state.etcd = _ProcState(pid, start, etcd_argv)
    info.etcd_pid = pid
    _write_state(directory, state)  # from here on, down() can clean up even if we crash
    _wait_etcd(info, state.etcd, deadline)

    api_argv = [*_apiserver_argv(bins, directory, pki, state.apiserver_port, state.etcd_client_port), *extra]
    pid, start = _spawn(api_argv, info.apiserver_log, directory)
    state.apiserver = _ProcState(pid, start, api_argv)
    info.apiserver_pid = pid
    _write_state(directory, state)
    _wait_apiserver(info, state.apiserver, deadline)
    return info


def up(
    directory: Path, *, bins: BinPaths | None = None, timeout: float = 120.0, apiserver_args: Sequence[str] = ()
) -> ControlPlaneInfo:
    """Start a fresh control plane in ``directory`` and return once it is ready to serve.
    ``apiserver_args`` are added to kube-apiserver's flags (e.g. a short
    ``--etcd-compaction-interval`` for a test of compaction as the apiserver does it).

    Fresh means new PKI, new tokens and an empty etcd.  Raises
    :class:`ControlPlaneError` (with log tails) if it does not become ready
    within ``timeout`` seconds, after stopping whatever it started, or if a
    control plane is already running there.  Free ports are picked by binding
    to port 0, which is racy against other processes; a lost race ("address
    already in use") is retried with new ports.
    """
    directory = directory.absolute()
    deadline = time.monotonic() + timeout
    with _dir_lock(directory):
        st = status(directory)
        if st.etcd_alive or st.apiserver_alive:
            raise ControlPlaneError(f"a control plane is already running in {directory} ({st.summary()})")
        _down_locked(directory)
        bins = bins or ensure_binaries()
        pki = certs.write_pki(directory)
        user_token, admin_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        tokens = component_tokens()
        certs.write_pem(
            directory / "tokens.csv",
            (
                f"{user_token},{USER_NAME},{USER_UID}\n"
                f'{admin_token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER}-uid,"system:masters"\n' + token_lines(tokens)
            ).encode(),
            private=True,
        )
        for log in _LOGS:
            (directory / log).write_bytes(b"")
        attempts = 3
        for attempt in range(1, attempts + 1):
            offsets = {log: _file_size(directory / log) for log in _LOGS}
            api_port, etcd_client, etcd_peer = free_ports(3)
            state = _State(
                version=bins.version,
                kubectl=str(bins.kubectl),
                apiserver_port=api_port,
                etcd_client_port=etcd_client,
                etcd_peer_port=etcd_peer,
                user_token=user_token,
                admin_token=admin_token,
                tokens=tokens,
            )
            server = f"https://127.0.0.1:{api_port}"
            write_kubeconfig(
                directory / "admin.kubeconfig",
                server=server,
                ca_file=pki.ca_cert,
                user=certs.ADMIN_COMMON_NAME,
                client_cert=pki.admin_cert,
                client_key=pki.admin_key,
            )
            write_kubeconfig(
                directory / "user.kubeconfig",
                server=server,
                ca_file=pki.ca_cert,
                user=USER_NAME,
                token=user_token,
            )
            try:
                return _start(directory, bins, pki, state, deadline, apiserver_args)
            except BaseException as e:
                _down_locked(directory)
                clash = any(_port_clash_since(directory / log, off) for log, off in offsets.items())
                if isinstance(e, ControlPlaneError) and attempt < attempts and clash:
                    continue
                raise
    raise AssertionError("unreachable")


def _down_locked(directory: Path, grace: float = 10.0) -> bool:
    try:
        state = _read_state(directory)
    except ControlPlaneError:
        # Unreadable state names no processes we could safely signal; drop it so up() can proceed.
        _remove_state(directory)
        return False
    if state is None:
        return False
    # The living cluster's components first (they are the apiserver's clients), then the apiserver:
    # it shuts down cleanly only while etcd is still there.
    for name in reversed(COMPONENTS):
        if (extra := state.extras.get(name)) is not None:
            _terminate(extra.pid, extra.start_time, grace=grace)
    for proc in (state.apiserver, state.etcd):
        if proc is not None:
            _terminate(proc.pid, proc.start_time, grace=grace)
    _remove_state(directory)
    return True


def down(directory: Path, *, grace: float = 10.0) -> bool:
    """Stop the control plane in ``directory`` (SIGTERM, SIGKILL after ``grace`` s) and forget it.

    Idempotent: returns False when there was nothing recorded to stop.  Files
    (logs, certificates, etcd data) are left for post-mortems.
    """
    directory = directory.absolute()
    if not (directory / _STATE_FILE).exists():
        return False
    with _dir_lock(directory):
        return _down_locked(directory, grace)


@dataclass(frozen=True)
class ControlPlaneStatus:
    """What :func:`status` found; ``up`` means both processes live and /readyz says ok."""

    dir: Path
    has_state: bool
    server: str | None = None
    etcd_pid: int | None = None
    etcd_alive: bool = False
    apiserver_pid: int | None = None
    apiserver_alive: bool = False
    ready: bool = False
    ports: Mapping[str, int] = field(default_factory=dict)
    admin_kubeconfig: Path | None = None
    user_kubeconfig: Path | None = None

    @property
    def up(self) -> bool:
        return self.etcd_alive and self.apiserver_alive and self.ready

    def summary(self) -> str:
        if not self.has_state:
            return f"down: no control plane in {self.dir}"

        def proc(name: str, pid: int | None, alive: bool) -> str:
            return f"{name}={pid if pid is not None else '-'}({'running' if alive else 'stopped'})"

        return " ".join(
            [
                "up" if self.up else "down",
                f"server={self.server}",
                proc("etcd", self.etcd_pid, self.etcd_alive),
                proc("apiserver", self.apiserver_pid, self.apiserver_alive),
                f"ready={'yes' if self.ready else 'no'}",
                f"dir={self.dir}",
            ]
        )


def status(directory: Path) -> ControlPlaneStatus:
    """Inspect ``directory`` without changing anything (and without waiting for a concurrent up)."""
    directory = directory.absolute()
    try:
        state = _read_state(directory)
    except ControlPlaneError:
        state = None
    if state is None:
        return ControlPlaneStatus(dir=directory, has_state=False)
    info = _info(directory, state)
    etcd_alive = bool(state.etcd and state.etcd.alive())
    api_alive = bool(state.apiserver and state.apiserver.alive())
    return ControlPlaneStatus(
        dir=directory,
        has_state=True,
        server=info.server,
        etcd_pid=info.etcd_pid,
        etcd_alive=etcd_alive,
        apiserver_pid=info.apiserver_pid,
        apiserver_alive=api_alive,
        ready=api_alive and info.readyz(),
        ports=state.ports,
        admin_kubeconfig=info.admin_kubeconfig,
        user_kubeconfig=info.user_kubeconfig,
    )
