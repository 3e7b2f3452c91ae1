"""A running control plane as tests see it: :class:`ControlPlaneInfo` (connect, probe, stop/start the apiserver)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import re
import ssl
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.localcluster.errors import ControlPlaneError
from kproxy.localcluster.kubectl import Kubectl
from kproxy.localcluster.processes import (
    _POLL_INTERVAL,
    _alive,
    _file_size,
    _port_clash_since,
    _spawn,
    _tail,
    _terminate,
)
from kproxy.localcluster.state import _dir_lock, _ProcState, _read_state, _require_state, _State, _write_state
from kproxy.server.tlschain import send_configured_chain_only

__all__ = ["USER_NAME", "ControlPlaneInfo", "client_ssl_context", "load"]

USER_NAME = "kproxy-user"


# --------------------------------------------------------------------------- HTTP (stdlib only)


def client_ssl_context(ca_file: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client context trusting ``ca_file``, presenting ``cert`` alone if given."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
        send_configured_chain_only(ctx)  # as client-go and kproxy: the leaf alone, not leaf + CA
    return ctx


def _https(
    port: int,
    ctx: ssl.SSLContext,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    # http.client rather than urllib: urllib would honour $HTTPS_PROXY, which must never apply here.
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- ControlPlaneInfo


@dataclass
class ControlPlaneInfo:
    """Everything a test needs to talk to (and disturb) a running control plane.

    Mutable on purpose: :meth:`stop_apiserver` / :meth:`start_apiserver` update
    ``apiserver_pid`` in place so a session-wide instance stays truthful.
    """

    dir: Path
    server: str
    apiserver_port: int
    etcd_client_port: int
    etcd_peer_port: int
    admin_kubeconfig: Path
    user_kubeconfig: Path
    user_name: str
    user_token: str
    #: Bearer token of a static-token user in system:masters, for clients that
    #: cannot present the admin client certificate (e.g. through a TLS-terminating proxy).
    admin_token: str
    ca_file: Path
    admin_cert: Path
    admin_key: Path
    kubectl: Path
    etcd_pid: int | None
    apiserver_pid: int | None
    version: str | None
    apiserver_log: Path = field(init=False)
    etcd_log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.apiserver_log = self.dir / "apiserver.log"
        self.etcd_log = self.dir / "etcd.log"

    @property
    def minor(self) -> int | None:
        """The Kubernetes minor of its binaries (``version`` is ``v1.MINOR.PATCH``), None if unknown."""
        found = re.match(r"v1\.(\d+)\.", self.version or "")
        return int(found.group(1)) if found else None

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    def etcd(self, call: str, body: Mapping[str, object]) -> dict[str, Any]:
        """One call to etcd's v3 JSON gateway (``kv/range``, ``kv/compaction``, ...)."""
        req = urllib.request.Request(
            f"{self.etcd_url}/v3/{call}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    def etcd_revision(self) -> int:
        """etcd's current revision (what the apiserver's resource versions count)."""
        head = self.etcd("kv/range", {"key": base64.b64encode(b"/registry/").decode(), "limit": 1})
        return int(head["header"]["revision"])

    def compact_etcd(self, revision: int) -> None:
        """Compact etcd's history up to ``revision``, as the apiserver does every 5 minutes."""
        self.etcd("kv/compaction", {"revision": str(revision), "physical": True})

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """A client context trusting the envtest CA, presenting the admin certificate unless told not to."""
        if client_cert:
            return client_ssl_context(self.ca_file, self.admin_cert, self.admin_key)
        return client_ssl_context(self.ca_file)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """One synchronous request to the apiserver: as admin (client cert), or as the bearer ``token``."""
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        ctx = self.ssl_context(client_cert=token is None)
        return _https(self.apiserver_port, ctx, method, path, body=body, headers=headers, timeout=timeout)

    def json(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        """:meth:`request` as admin with a JSON body, asserting a 200 or 201; the answer decoded."""
        data = json.dumps(body).encode() if body is not None else None
        code, out = self.request(method, path, body=data, content_type=content_type)
        if code not in (200, 201):
            raise AssertionError(f"{method} {path}: HTTP {code}: {out[:300]!r}")
        return json.loads(out)

    def readyz(self, timeout: float = 2.0) -> bool:
        """Whether the apiserver answers ``/readyz`` with 200 right now."""
        try:
            status, _ = self.request("GET", "/readyz", timeout=timeout)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def apiserver_alive(self) -> bool:
        state = _read_state(self.dir)
        return bool(state and state.apiserver and state.apiserver.alive())

    def stop_apiserver(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop kube-apiserver only (etcd keeps the data); ``kill=True`` is an abrupt SIGKILL outage."""
        with _dir_lock(self.dir):
            state = _require_state(self.dir)
            if state.apiserver is not None:
                _terminate(state.apiserver.pid, state.apiserver.start_time, kill=kill, grace=timeout)
                state.apiserver.pid = None
                state.apiserver.start_time = None
                _write_state(self.dir, state)
            self.apiserver_pid = None

    def start_apiserver(self, *, timeout: float = 120.0) -> None:
        """Start kube-apiserver again with the same flags and port and wait for /readyz; no-op if running.

        If the port is still held (say the test killed the old process behind
        our back and it is still exiting), starting is retried until ``timeout``.
        """
        deadline = time.monotonic() + timeout
        with _dir_lock(self.dir):
            state = _require_state(self.dir)
            api = state.apiserver
            if api is None:
                raise ControlPlaneError(f"{self.dir}: no apiserver command line recorded")
            etcd = state.etcd
            if etcd is None or not etcd.alive():
                raise ControlPlaneError(f"{self.dir}: etcd is not running; use down/up")
            while True:
                log_offset: int | None = None
                if not api.alive():
                    log_offset = _file_size(self.apiserver_log)
                    api.pid, api.start_time = _spawn(api.argv, self.apiserver_log, self.dir)
                    _write_state(self.dir, state)
                self.apiserver_pid = api.pid
                try:
                    _wait_apiserver(self, api, deadline)
                    return
                except ControlPlaneError:
                    _terminate(api.pid, api.start_time)
                    api.pid = api.start_time = None
                    _write_state(self.dir, state)
                    self.apiserver_pid = None
                    clash = log_offset is not None and _port_clash_since(self.apiserver_log, log_offset)
                    if not clash or time.monotonic() + 0.5 >= deadline:
                        raise
                time.sleep(0.5)

    def restart_apiserver(self, *, kill: bool = False, timeout: float = 120.0) -> None:
        """:meth:`stop_apiserver` then :meth:`start_apiserver` (same port, new pid)."""
        self.stop_apiserver(kill=kill)
        self.start_apiserver(timeout=timeout)

    def kubectl_runner(self) -> Kubectl:
        """A :class:`Kubectl` defaulting to the admin kubeconfig."""
        return Kubectl(
            binary=self.kubectl,
            default_kubeconfig=self.admin_kubeconfig,
            cache_dir=self.dir / "kubectl-cache",
        )


def _info(directory: Path, state: _State) -> ControlPlaneInfo:
    return ControlPlaneInfo(
        dir=directory,
        server=f"https://127.0.0.1:{state.apiserver_port}",
        apiserver_port=state.apiserver_port,
        etcd_client_port=state.etcd_client_port,
        etcd_peer_port=state.etcd_peer_port,
        admin_kubeconfig=directory / "admin.kubeconfig",
        user_kubeconfig=directory / "user.kubeconfig",
        user_name=USER_NAME,
        user_token=state.user_token,
        admin_token=state.admin_token,
        ca_file=directory / "ca.crt",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        kubectl=Path(state.kubectl),
        etcd_pid=state.etcd.pid if state.etcd else None,
        apiserver_pid=state.apiserver.pid if state.apiserver else None,
        version=state.version,
    )


def load(directory: Path) -> ControlPlaneInfo:
    """The :class:`ControlPlaneInfo` of a control plane started earlier (possibly by another process)."""
    directory = directory.absolute()
    return _info(directory, _require_state(directory))


# --------------------------------------------------------------------------- readiness


def _failure(what: str, info: ControlPlaneInfo, logs: Sequence[Path]) -> ControlPlaneError:
    parts = [what]
    for log in logs:
        parts.append(f"--- last lines of {log} ---\n{_tail(log)}")
    return ControlPlaneError("\n".join(parts))


def _wait_apiserver(info: ControlPlaneInfo, proc: _ProcState, deadline: float) -> None:
    """Wait for /readyz, then for the ``default`` namespace, which tests commonly assume exists."""

    def check_running(stage: str) -> None:
        if not proc.alive():
            logs = [info.apiserver_log]
            if not _alive(info.etcd_pid, None):
                logs.append(info.etcd_log)
            raise _failure(f"kube-apiserver exited {stage}", info, logs)
        if time.monotonic() > deadline:
            raise _failure(f"kube-apiserver not ready on {info.server} in time ({stage})", info, [info.apiserver_log])

    while not info.readyz():
        check_running("before /readyz succeeded")
        time.sleep(_POLL_INTERVAL)
    while True:
        with contextlib.suppress(OSError, http.client.HTTPException):
            code, _ = info.request("GET", "/api/v1/namespaces/default", timeout=2.0)
            if code == 200:
                return
        check_running("before namespace default existed")
        time.sleep(_POLL_INTERVAL)
