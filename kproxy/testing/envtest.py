"""A real, local Kubernetes control plane for tests: etcd + kube-apiserver ("envtest").

Why a real apiserver instead of a fake: kproxy is a transparent streaming proxy,
and the behaviours worth testing (watch streams, chunked lists, protobuf,
authn/authz errors, upstream outages) are exactly the ones a fake gets subtly
wrong.  No kubelet, scheduler or controller-manager run here, so pods never
start and namespaces never finish deleting; everything the API server does on
its own (storage, validation, RBAC, watch) is real.

Binaries are built from source by ``tools/envtest/build.sh`` at the Kubernetes
release pinned in ``tools/envtest/go.mod`` and cached under
``~/.cache/kproxy/envtest/<version>/``; nothing is downloaded at test time.

Layout of a control-plane directory (``up(DIR)``)::

    DIR/state.json          pids, ports, argv, tokens (0600): the source of truth for down/status
    DIR/ca.crt ...          PKI from kproxy.testing.certs
    DIR/tokens.csv          static bearer tokens (--token-auth-file)
    DIR/admin.kubeconfig    client-cert user in system:masters
    DIR/user.kubeconfig     bearer-token user "kproxy-user" without any RBAC binding
    DIR/etcd/               etcd data (wiped on every up: each up is a fresh cluster)
    DIR/etcd.log, DIR/apiserver.log

Processes are started in their own sessions so they outlive the Python process
that ran ``up`` (the CLI returns while the control plane keeps running);
``down`` reads state.json and signals the process groups.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from kproxy.testing import certs

__all__ = [
    "BIN_DIR_ENV",
    "DIR_ENV",
    "USER_NAME",
    "BinPaths",
    "ControlPlaneError",
    "ControlPlaneInfo",
    "ControlPlaneStatus",
    "EnvtestError",
    "Kubectl",
    "KubectlError",
    "default_cache_dir",
    "down",
    "ensure_binaries",
    "k8s_version",
    "load",
    "main",
    "status",
    "up",
    "write_kubeconfig",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVTEST_TOOL_DIR = REPO_ROOT / "tools" / "envtest"
#: Built binaries live outside the clone (as in the Makefile), so fresh clones and CI reuse them.
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kproxy" / "envtest"

#: A directory holding prebuilt ``etcd``, ``kube-apiserver`` and ``kubectl``; skips the build.
BIN_DIR_ENV = "KPROXY_ENVTEST_BIN_DIR"
#: A control-plane directory started with ``kproxy envtest up``; the pytest plugin reuses it.
DIR_ENV = "KPROXY_ENVTEST_DIR"

BINARIES = ("etcd", "kube-apiserver", "kubectl")
USER_NAME = "kproxy-user"
USER_UID = "kproxy-user-uid"
ADMIN_TOKEN_USER = "kproxy-admin-token"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"

_STATE_FILE = "state.json"
_LOCK_FILE = ".envtest.lock"
_STATE_FORMAT = 1
_LOG_TAIL_LINES = 60
_POLL_INTERVAL = 0.1


class EnvtestError(RuntimeError):
    """Binaries could not be found or built."""


class ControlPlaneError(EnvtestError):
    """The control plane could not be started, stopped or inspected."""


# --------------------------------------------------------------------------- version pin


def _strip_comment(line: str) -> str:
    return line.split("//", 1)[0].strip()


def k8s_version(go_mod: Path | None = None) -> str:
    """The ``k8s.io/kubernetes`` version pinned in ``tools/envtest/go.mod`` (e.g. ``v1.37.1``).

    go.mod is parsed rather than asking ``go list`` so this works without a Go
    toolchain (prebuilt binaries, CI caches).  The module is only used through
    ``tool`` directives, so it appears in a ``require`` block (often marked
    ``// indirect``); a ``replace`` of it to another version wins, as in Go.
    """
    path = go_mod or ENVTEST_TOOL_DIR / "go.mod"
    try:
        text = path.read_text()
    except OSError as e:
        raise EnvtestError(f"cannot read the envtest version pin: {e}") from e
    module = "k8s.io/kubernetes"
    required: str | None = None
    replaced: str | None = None
    block: str | None = None
    for raw in text.splitlines():
        line = _strip_comment(raw)
        if not line:
            continue
        if block is not None:
            if line == ")":
                block = None
                continue
            directive, rest = block, line
        else:
            directive, _, rest = line.partition(" ")
            rest = rest.strip()
            if rest == "(":
                block = directive
                continue
        if directive == "require":
            parts = rest.split()
            if len(parts) >= 2 and parts[0] == module:
                required = parts[1]
        elif directive == "replace":
            old, arrow, new = rest.partition("=>")
            if arrow and old.split() and old.split()[0] == module:
                target = new.split()
                # "=> ../local/path" has no version: the require line still names the release.
                if len(target) == 2:
                    replaced = target[1]
    version = replaced or required
    if not version or not re.fullmatch(r"v\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?", version):
        raise EnvtestError(f"no usable {module} version found in {path} (got {version!r})")
    return version


# --------------------------------------------------------------------------- binaries


@dataclass(frozen=True)
class BinPaths:
    """Where the three control-plane binaries are, and which release they were built from."""

    dir: Path
    etcd: Path
    kube_apiserver: Path
    kubectl: Path
    version: str | None

    @classmethod
    def in_dir(cls, directory: Path) -> BinPaths:
        directory = directory.absolute()
        version_file = directory / "VERSION"
        version = version_file.read_text().strip() if version_file.is_file() else None
        return cls(
            dir=directory,
            etcd=directory / "etcd",
            kube_apiserver=directory / "kube-apiserver",
            kubectl=directory / "kubectl",
            version=version,
        )

    def missing(self) -> list[Path]:
        """Binaries that are absent or not executable."""
        return [p for p in (self.etcd, self.kube_apiserver, self.kubectl) if not os.access(p, os.X_OK)]


def default_cache_dir(version: str | None = None) -> Path:
    """``~/.cache/kproxy/envtest/<version>``: one directory per pinned release, so bumping the pin rebuilds."""
    return CACHE_ROOT / (version or k8s_version())


def _build(out_dir: Path, out: IO[str]) -> None:
    script = ENVTEST_TOOL_DIR / "build.sh"
    print(
        f"kproxy envtest: building etcd, kube-apiserver, kubectl into {out_dir} (a cold build takes 15-30 minutes)...",
        file=out,
        flush=True,
    )
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", str(script), str(out_dir)],
            cwd=ENVTEST_TOOL_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as e:
        raise EnvtestError(f"cannot run {script}: {e}") from e
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            out.write(line)
            out.flush()
    if proc.returncode != 0:
        raise EnvtestError(
            f"{script} {out_dir} failed with exit code {proc.returncode} (output above); "
            "it needs a Go toolchain on PATH, or set "
            f"{BIN_DIR_ENV} to a directory with prebuilt etcd, kube-apiserver and kubectl"
        )
    print(f"kproxy envtest: build finished in {time.monotonic() - started:.0f}s", file=out, flush=True)


def ensure_binaries(*, build: bool = True, out: IO[str] | None = None) -> BinPaths:
    """Return the control-plane binaries for the pinned release, building them if needed.

    ``$KPROXY_ENVTEST_BIN_DIR`` wins if set (and is never built into).  Otherwise
    the cache directory is complete when its VERSION file (written last by
    build.sh) matches the pin.  The build runs under an exclusive flock on
    ``<dir>.lock`` so concurrent test runs wait for one build instead of racing
    two on a small machine; the state is re-checked after taking the lock.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bins = BinPaths.in_dir(Path(override))
        if missing := bins.missing():
            raise EnvtestError(f"${BIN_DIR_ENV}={override} lacks executables: {', '.join(map(str, missing))}")
        return bins

    version = k8s_version()
    directory = default_cache_dir(version)

    def ready() -> BinPaths | None:
        bins = BinPaths.in_dir(directory)
        return bins if bins.version == version and not bins.missing() else None

    if found := ready():
        return found
    if not build:
        raise EnvtestError(f"envtest binaries for {version} are not built in {directory}")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{directory}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found := ready():  # someone else built it while we waited
            return found
        _build(directory, out or sys.stderr)
    if found := ready():
        return found
    raise EnvtestError(f"build.sh succeeded but {directory} does not hold {version} binaries")


# --------------------------------------------------------------------------- processes

# Popen objects of processes this interpreter started, so they can be reaped
# (a dead-but-unreaped child is a zombie that still answers kill(pid, 0)).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _proc_start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (from /proc); with the pid it identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    # fields[0] is field 3 (state); starttime is field 22.
    return fields[19] if len(fields) > 19 else None


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def _alive(pid: int | None, start_time: str | None) -> bool:
    """Whether ``pid`` is still the process we started (running, not a zombie, not a reused pid)."""
    if pid is None:
        return False
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists but belongs to someone else: the start-time check decides
    if _proc_state(pid) in ("Z", "X"):
        # The thread-group leader of a killed Go program turns zombie while its other threads are
        # still exiting and holding its sockets; it is gone only when no other task remains.
        try:
            return any(int(t) != pid for t in os.listdir(f"/proc/{pid}/task"))
        except (OSError, ValueError):
            return False
    if start_time is not None:
        current = _proc_start_time(pid)
        if current is not None and current != start_time:
            return False
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group ``pid`` leads (all we start are session leaders), else just ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_dead(pid: int, start_time: str | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start_time):
        child = _CHILDREN.get(pid)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=min(remaining, 0.5))
        else:
            time.sleep(min(remaining, _POLL_INTERVAL))
    return True


def _terminate(pid: int | None, start_time: str | None, *, kill: bool = False, grace: float = 10.0) -> None:
    """SIGTERM (or SIGKILL right away) the process group, escalating to SIGKILL after ``grace`` seconds."""
    if pid is None or not _alive(pid, start_time):
        _CHILDREN.pop(pid or -1, None)
        return
    _signal_group(pid, signal.SIGKILL if kill else signal.SIGTERM)
    if not _wait_dead(pid, start_time, 0.0 if kill else grace):
        _signal_group(pid, signal.SIGKILL)
        if not _wait_dead(pid, start_time, 10.0):
            raise ControlPlaneError(f"process {pid} survived SIGKILL")
    # Stragglers in the group (the group id stays reserved while any member lives, so this is safe).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _CHILDREN.pop(pid, None)


def _spawn(argv: Sequence[str], log: Path, cwd: Path) -> tuple[int, str | None]:
    """Start ``argv`` detached (own session, output appended to ``log``); return pid and start time."""
    with open(log, "ab") as f:
        f.write(f"\n=== kproxy envtest {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n".encode())
        f.flush()
        try:
            child = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise ControlPlaneError(f"cannot start {argv[0]}: {e}") from e
    _CHILDREN[child.pid] = child
    return child.pid, _proc_start_time(child.pid)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together so they differ; racy by nature, see up())."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _port_clash_since(log: Path, offset: int) -> bool:
    """Whether the process logging to ``log`` after byte ``offset`` failed to bind its port."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return b"address already in use" in f.read()
    except OSError:
        return False


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.splitlines()[-lines:])


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """Serialize up/down/restart on one directory across processes (flock is per open file)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / _LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


# --------------------------------------------------------------------------- state


@dataclass
class _ProcState:
    pid: int | None
    start_time: str | None
    argv: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "argv": self.argv}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> _ProcState:
        return cls(pid=d.get("pid"), start_time=d.get("start_time"), argv=list(d.get("argv", [])))


@dataclass
class _State:
    version: str | None
    kubectl: str
    apiserver_port: int
    etcd_client_port: int
    etcd_peer_port: int
    user_token: str
    admin_token: str
    etcd: _ProcState | None = None
    apiserver: _ProcState | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _STATE_FORMAT,
            "version": self.version,
            "kubectl": self.kubectl,
            "ports": {
                "apiserver": self.apiserver_port,
                "etcd_client": self.etcd_client_port,
                "etcd_peer": self.etcd_peer_port,
            },
            "user_token": self.user_token,
            "admin_token": self.admin_token,
            "etcd": self.etcd.to_json() if self.etcd else None,
            "apiserver": self.apiserver.to_json() if self.apiserver else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> _State:
        if d.get("format") != _STATE_FORMAT:
            raise ControlPlaneError(f"unsupported state format {d.get('format')!r}")
        ports = d["ports"]
        return cls(
            version=d.get("version"),
            kubectl=d["kubectl"],
            apiserver_port=int(ports["apiserver"]),
            etcd_client_port=int(ports["etcd_client"]),
            etcd_peer_port=int(ports["etcd_peer"]),
            user_token=d["user_token"],
            admin_token=d["admin_token"],
            etcd=_ProcState.from_json(d["etcd"]) if d.get("etcd") else None,
            apiserver=_ProcState.from_json(d["apiserver"]) if d.get("apiserver") else None,
        )


def _write_state(directory: Path, state: _State) -> None:
    """Atomically replace state.json (0600: it holds bearer tokens)."""
    certs.write_pem(directory / _STATE_FILE, json.dumps(state.to_json(), indent=2).encode(), private=True)


def _read_state(directory: Path) -> _State | None:
    path = directory / _STATE_FILE
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return _State.from_json(json.loads(raw))
    except (ValueError, KeyError, TypeError) as e:
        raise ControlPlaneError(f"corrupt {path}: {e}") from e


# --------------------------------------------------------------------------- HTTP (stdlib only)


def _client_ssl_context(ca_file: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
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


# --------------------------------------------------------------------------- kubeconfig


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path | None,
    user: str,
    token: str | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    namespace: str = "default",
) -> Path:
    """Write a self-contained kubeconfig (certificates embedded as ``*-data``), mode 0600.

    Public so tests can point a kubeconfig at something else (e.g. a kproxy
    listener) with the same credentials.  Embedding keeps the file valid when
    copied elsewhere and avoids relative-path surprises.
    """

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cluster: dict[str, Any] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority-data"] = b64(ca_file)
    credentials: dict[str, Any] = {}
    if token is not None:
        credentials["token"] = token
    if client_cert is not None:
        credentials["client-certificate-data"] = b64(client_cert)
    if client_key is not None:
        credentials["client-key-data"] = b64(client_key)
    context = f"envtest-{user}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": cluster}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": context, "context": {"cluster": "envtest", "user": user, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    return certs.write_pem(path, yaml.safe_dump(config, sort_keys=False).encode(), private=True)


# --------------------------------------------------------------------------- kubectl


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl run whose message includes stderr (CalledProcessError's omits it)."""

    def __str__(self) -> str:
        stderr = self.stderr if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}\nstderr:\n{stderr.strip()}"


@dataclass(frozen=True)
class Kubectl:
    """Runs the envtest-built kubectl (same release as the apiserver) against a kubeconfig.

    ``kubeconfig`` defaults to the admin one; pass any other (the user one, or
    one pointing at kproxy).  Discovery is cached under ``cache_dir`` rather
    than ``~/.kube/cache`` to keep runs hermetic.
    """

    binary: Path
    default_kubeconfig: Path
    cache_dir: Path

    def run(
        self,
        args: Sequence[str],
        *,
        kubeconfig: Path | str | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        config = str(kubeconfig or self.default_kubeconfig)
        argv = [str(self.binary), f"--kubeconfig={config}", f"--cache-dir={self.cache_dir}", *args]
        env = dict(os.environ, KUBECONFIG=config)
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    __call__ = run

    def json(self, args: Sequence[str], *, kubeconfig: Path | str | None = None, timeout: float = 60.0) -> Any:
        """Run ``kubectl ARGS -o json`` (check=True) and parse stdout."""
        return json.loads(self.run([*args, "-o", "json"], kubeconfig=kubeconfig, timeout=timeout).stdout)


# --------------------------------------------------------------------------- control plane


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
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    def ssl_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """A client context trusting the envtest CA, presenting the admin certificate unless told not to."""
        if client_cert:
            return _client_ssl_context(self.ca_file, self.admin_cert, self.admin_key)
        return _client_ssl_context(self.ca_file)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, bytes]:
        """One synchronous request to the apiserver: as admin (client cert), or as the bearer ``token``."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        ctx = self.ssl_context(client_cert=token is None)
        return _https(self.apiserver_port, ctx, method, path, body=body, headers=headers, timeout=timeout)

    def readyz(self, timeout: float = 2.0) -> bool:
        """Whether the apiserver answers ``/readyz`` with 200 right now."""
        try:
            status, _ = self.request("GET", "/readyz", timeout=timeout)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200

    def apiserver_alive(self) -> bool:
        state = _read_state(self.dir)
        return bool(state and state.apiserver and _alive(state.apiserver.pid, state.apiserver.start_time))

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
            if etcd is None or not _alive(etcd.pid, etcd.start_time):
                raise ControlPlaneError(f"{self.dir}: etcd is not running; use down/up")
            while True:
                log_offset: int | None = None
                if not _alive(api.pid, api.start_time):
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


def _require_state(directory: Path) -> _State:
    state = _read_state(directory)
    if state is None:
        raise ControlPlaneError(f"no control plane state in {directory} (run up first)")
    return state


def load(directory: Path) -> ControlPlaneInfo:
    """The :class:`ControlPlaneInfo` of a control plane started earlier (possibly by another process)."""
    directory = directory.absolute()
    return _info(directory, _require_state(directory))


def _failure(what: str, info: ControlPlaneInfo, logs: Sequence[Path]) -> ControlPlaneError:
    parts = [what]
    for log in logs:
        parts.append(f"--- last lines of {log} ---\n{_tail(log)}")
    return ControlPlaneError("\n".join(parts))


def _wait_etcd(info: ControlPlaneInfo, proc: _ProcState, deadline: float) -> None:
    while not _etcd_healthy(info.etcd_client_port):
        if not _alive(proc.pid, proc.start_time):
            raise _failure("etcd exited during startup", info, [info.etcd_log])
        if time.monotonic() > deadline:
            raise _failure(f"etcd not healthy on {info.etcd_url} in time", info, [info.etcd_log])
        time.sleep(_POLL_INTERVAL)


def _wait_apiserver(info: ControlPlaneInfo, proc: _ProcState, deadline: float) -> None:
    """Wait for /readyz, then for the ``default`` namespace, which tests commonly assume exists."""

    def check_running(stage: str) -> None:
        if not _alive(proc.pid, proc.start_time):
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


def _start(directory: Path, bins: BinPaths, pki: certs.PKIFiles, state: _State, deadline: float) -> ControlPlaneInfo:
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

    api_argv = _apiserver_argv(bins, directory, pki, state.apiserver_port, state.etcd_client_port)
    pid, start = _spawn(api_argv, info.apiserver_log, directory)
    state.apiserver = _ProcState(pid, start, api_argv)
    info.apiserver_pid = pid
    _write_state(directory, state)
    _wait_apiserver(info, state.apiserver, deadline)
    return info


def up(directory: Path, *, bins: BinPaths | None = None, timeout: float = 120.0) -> ControlPlaneInfo:
    """Start a fresh control plane in ``directory`` and return once it is ready to serve.

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
        certs.write_pem(
            directory / "tokens.csv",
            (
                f"{user_token},{USER_NAME},{USER_UID}\n"
                f'{admin_token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER}-uid,"system:masters"\n'
            ).encode(),
            private=True,
        )
        for log in ("etcd.log", "apiserver.log"):
            (directory / log).write_bytes(b"")
        attempts = 3
        for attempt in range(1, attempts + 1):
            offsets = {log: _file_size(directory / log) for log in ("etcd.log", "apiserver.log")}
            api_port, etcd_client, etcd_peer = _free_ports(3)
            state = _State(
                version=bins.version,
                kubectl=str(bins.kubectl),
                apiserver_port=api_port,
                etcd_client_port=etcd_client,
                etcd_peer_port=etcd_peer,
                user_token=user_token,
                admin_token=admin_token,
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
                return _start(directory, bins, pki, state, deadline)
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
        (directory / _STATE_FILE).unlink(missing_ok=True)
        return False
    if state is None:
        return False
    # apiserver first: it shuts down cleanly only while etcd is still there.
    for proc in (state.apiserver, state.etcd):
        if proc is not None:
            _terminate(proc.pid, proc.start_time, grace=grace)
    (directory / _STATE_FILE).unlink(missing_ok=True)
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
    etcd_alive = bool(state.etcd and _alive(state.etcd.pid, state.etcd.start_time))
    api_alive = bool(state.apiserver and _alive(state.apiserver.pid, state.apiserver.start_time))
    return ControlPlaneStatus(
        dir=directory,
        has_state=True,
        server=info.server,
        etcd_pid=info.etcd_pid,
        etcd_alive=etcd_alive,
        apiserver_pid=info.apiserver_pid,
        apiserver_alive=api_alive,
        ready=api_alive and info.readyz(),
        ports={
            "apiserver": state.apiserver_port,
            "etcd_client": state.etcd_client_port,
            "etcd_peer": state.etcd_peer_port,
        },
        admin_kubeconfig=info.admin_kubeconfig,
        user_kubeconfig=info.user_kubeconfig,
    )


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``kproxy envtest {build,up,down,status} [--dir DIR]``; returns the exit code."""
    env_dir = os.environ.get(DIR_ENV)
    parser = argparse.ArgumentParser(
        prog="kproxy envtest",
        description="Run a local etcd + kube-apiserver for kproxy development and tests.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find) the pinned etcd/kube-apiserver/kubectl and print their dir")
    for name, help_ in (
        ("up", "start a fresh control plane in DIR"),
        ("down", "stop the control plane in DIR"),
        ("status", "exit 0 if the control plane in DIR is up, 1 if not"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--dir",
            type=Path,
            default=Path(env_dir) if env_dir else None,
            required=not env_dir,
            help=f"control-plane directory (default: ${DIR_ENV})",
        )
        if name == "up":
            p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2

    try:
        if args.command == "build":
            print(ensure_binaries().dir)
            return 0
        directory: Path = args.dir.absolute()
        if args.command == "up":
            started = time.monotonic()
            info = up(directory, timeout=args.timeout)
            print(f"envtest {info.version} is up ({time.monotonic() - started:.1f}s)")
            print(f"  server:           {info.server}")
            print(f"  admin kubeconfig: {info.admin_kubeconfig}")
            print(f"  user kubeconfig:  {info.user_kubeconfig}  ({info.user_name}, no RBAC bindings)")
            print(f"  kubectl:          {info.kubectl}")
            print(f"  logs:             {info.etcd_log} {info.apiserver_log}")
            print(f"export KUBECONFIG={info.admin_kubeconfig}")
            print(f"export {DIR_ENV}={directory}")
            print(f"stop with: kproxy envtest down --dir {directory}")
            return 0
        if args.command == "down":
            print(f"stopped control plane in {directory}" if down(directory) else f"nothing running in {directory}")
            return 0
        st = status(directory)
        print(st.summary())
        return 0 if st.up else 1
    except EnvtestError as e:
        print(f"kproxy envtest {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
