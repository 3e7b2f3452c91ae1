"""The living cluster: the real controllers, scheduler and simulated nodes beside a control plane.

``kproxy envtest up --components proxied`` (what ``make run`` starts) adds to etcd and kube-apiserver:

* a ``kproxy run`` (``DIR/kproxy.yaml``, HTTPS with ``credentials: forward``) in front of the apiserver;
* ``kube-controller-manager`` and ``kube-scheduler`` of the same release, each with its own bearer token
  (the apiserver's bootstrap RBAC knows ``system:kube-controller-manager`` and ``system:kube-scheduler``;
  the controller-manager runs each controller as its own service account, whose tokens it mints with the
  control plane's signing key), and
* ``kwok`` (sigs.k8s.io/kwok), which keeps nodes Ready with leases and moves pods through their lifecycle
  (Running, Job pods Succeeded, deletions finished) without a container runtime.

With ``proxied`` every informer, lease, status update and bind of the components crosses kproxy's chain
(the sidecar and gateway use); with ``direct`` they talk to the apiserver itself, for comparison. Their
processes are recorded in ``state.json`` beside etcd's and the apiserver's, so ``down`` stops them all.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kproxy.localcluster.binaries import KWOK_STAGES, REPO_ROOT, BinPaths, ensure_extra
from kproxy.localcluster.controlplane import ControlPlaneInfo
from kproxy.localcluster.errors import ControlPlaneError
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.localcluster.processes import _POLL_INTERVAL, _spawn, _tail, _terminate, free_ports
from kproxy.localcluster.state import _dir_lock, _ProcState, _require_state, _State, _write_state

__all__ = [
    "COMPONENTS",
    "MODES",
    "NODE_ANNOTATION",
    "component_tokens",
    "forget_node_leases",
    "nodes_ready",
    "proxy_kubeconfig",
    "recommended_config",
    "restart_component",
    "running_components",
    "start_components",
    "stop_components",
]

#: How the components reach the apiserver.
MODES = ("proxied", "direct")
#: The components, in start order (kproxy only when proxied); stopped in reverse.
COMPONENTS = ("kproxy", "kube-controller-manager", "kube-scheduler", "kwok")
#: kwok manages the nodes carrying this annotation (its own convention), and only those.
NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Each component's identity at the apiserver: (user, groups) for its line in tokens.csv.
IDENTITIES: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
    # kwok writes node and pod status and the nodes' leases, which no bootstrap role grants together.
    "kwok": ("kwok", ("system:masters",)),
}
#: Where kproxy listens when the config gives no address (the `kubectl proxy` port).
DEFAULT_PROXY_LISTEN = "127.0.0.1:8001"


def recommended_config() -> dict[str, Any]:
    """``config.recommended.yaml`` (the chain ``make run`` runs) listening on a free loopback port, its admin
    listener left for :func:`start_components` to pick: for tests and benchmarks beside other kproxies."""
    cfg: dict[str, Any] = yaml.safe_load((REPO_ROOT / "config.recommended.yaml").read_text())
    cfg["listen"] = f"127.0.0.1:{free_ports(1)[0]}"
    cfg.pop("admin_listen", None)
    return cfg


def component_tokens() -> dict[str, str]:
    """Fresh bearer tokens for :data:`IDENTITIES` (written into tokens.csv by ``up``)."""
    return {name: secrets.token_urlsafe(32) for name in IDENTITIES}


def token_lines(tokens: Mapping[str, str]) -> str:
    """tokens.csv lines (``token,user,uid,"group1,group2"``) for the components' tokens."""
    lines = []
    for name, token in tokens.items():
        user, groups = IDENTITIES[name]
        line = f"{token},{user},{user}-uid"
        if groups:
            line += ',"' + ",".join(groups) + '"'
        lines.append(line + "\n")
    return "".join(lines)


def _log(directory: Path, name: str) -> Path:
    return directory / f"{name}.log"


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    import ssl

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a liveness probe of our own child on loopback
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait(directory: Path, name: str, proc: _ProcState, ready: str, deadline: float) -> None:
    while not _http_ok(ready):
        if not proc.alive():
            raise ControlPlaneError(f"{name} exited during startup; log tail:\n{_tail(_log(directory, name))}")
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{name} not ready at {ready} in time; log tail:\n{_tail(_log(directory, name))}")
        time.sleep(_POLL_INTERVAL)


def proxy_config(config: Mapping[str, Any], info: ControlPlaneInfo, admin_listen: str) -> dict[str, Any]:
    """The living cluster's kproxy config: the user's (filters, logging, listen) with what the cluster fixes.

    The cluster fixes how kproxy reaches the apiserver (the admin kubeconfig), serves (HTTPS with a
    certificate of the control plane's CA, so components verify it) and whose rights reach the apiserver
    (``forward``: each component's own token; the apiserver sees who called).
    """
    cfg = dict(config)
    cfg.setdefault("listen", DEFAULT_PROXY_LISTEN)
    cfg["admin_listen"] = admin_listen
    cfg["credentials"] = "forward"
    cfg.pop("proxy", None)  # kubectl proxy's filter applies to credentials: proxy only
    cfg["upstream"] = {**(cfg.get("upstream") or {}), "kubeconfig": str(info.admin_kubeconfig)}
    cfg["tls"] = {"cert_file": str(info.dir / "kproxy.crt"), "key_file": str(info.dir / "kproxy.key")}
    return cfg


def _listen_url(cfg: Mapping[str, Any]) -> str:
    listen = str(cfg["listen"])
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"


def _kcm_argv(bins: BinPaths, info: ControlPlaneInfo, kubeconfig: Path, port: int, leader_elect: bool) -> list[str]:
    d = info.dir
    return [
        str(bins.dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={d / 'kcm-serving'}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--service-account-private-key-file={d / 'sa.key'}",
        f"--root-ca-file={info.ca_file}",
        "--use-service-account-credentials=true",
        f"--leader-elect={'true' if leader_elect else 'false'}",
        "--cluster-name=kproxy-local",
        # The simulated nodes get pod CIDRs from the node-ipam controller, as kubeadm clusters do.
        "--allocate-node-cidrs=true",
        "--cluster-cidr=10.244.0.0/16",
        "--service-cluster-ip-range=10.0.0.0/24",
    ]


def _scheduler_argv(bins: BinPaths, kubeconfig: Path, port: int, leader_elect: bool) -> list[str]:
    return [
        str(bins.dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--leader-elect={'true' if leader_elect else 'false'}",
    ]


def _kwok_argv(bins: BinPaths, kubeconfig: Path, port: int) -> list[str]:
    return [
        str(bins.dir / "kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={bins.dir / KWOK_STAGES}",
        f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40",
        "--cidr=10.244.0.0/16",
        "--node-ip=10.0.1.1",
        f"--server-address=127.0.0.1:{port}",
    ]


def start_components(
    info: ControlPlaneInfo,
    *,
    mode: str,
    proxy: Mapping[str, Any] | None = None,
    nodes: int = 3,
    leader_elect: bool = True,
    admin_listen: str | None = None,
    extra_args: Mapping[str, Sequence[str]] | None = None,
    bins: BinPaths | None = None,
    timeout: float = 120.0,
) -> str:
    """Start the living cluster's components beside the control plane in ``info.dir``; return their server URL.

    ``mode`` is ``proxied`` (a kproxy from ``proxy``, the parsed config, in front; the components use it)
    or ``direct``. ``nodes`` simulated nodes are created (or kept) and waited for until Ready. kproxy's
    admin listener is ``admin_listen`` if given, else a free loopback port (the config's is replaced).
    ``extra_args`` adds flags to a component's command line by name (say a log verbosity).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if extra_args and not set(extra_args) <= set(COMPONENTS[1:]):
        raise ValueError(f"extra_args names components among {COMPONENTS[1:]}, not {sorted(extra_args)}")
    deadline = time.monotonic() + timeout
    directory = info.dir
    binaries = {name: ensure_extra(name) for name in ("kube-controller-manager", "kube-scheduler", "kwok")}
    bins = bins or BinPaths.in_dir(binaries["kwok"].parent)
    with _dir_lock(directory):
        state = _require_state(directory)
        if state.extras and any(p.alive() for p in state.extras.values()):
            raise ControlPlaneError(f"components already run in {directory}; stop them first")
        if set(state.tokens) != set(IDENTITIES):
            raise ControlPlaneError(f"{directory} was started without component tokens; run down and up again")
        state.extras = {}
        server = info.server
        try:
            if mode == "proxied":
                server = _start_proxy(info, state, proxy or {}, admin_listen, deadline)
            ports = free_ports(3)
            kcm, sched, kwok = (_kubeconfig(info, state, n, server) for n in COMPONENTS[1:])
            argvs = {
                "kube-controller-manager": _kcm_argv(bins, info, kcm, ports[0], leader_elect),
                "kube-scheduler": _scheduler_argv(bins, sched, ports[1], leader_elect),
                "kwok": _kwok_argv(bins, kwok, ports[2]),
            }
            for name, extra in (extra_args or {}).items():
                argvs[name] += extra
            ready = {
                "kube-controller-manager": f"https://127.0.0.1:{ports[0]}/healthz",
                "kube-scheduler": f"https://127.0.0.1:{ports[1]}/healthz",
                "kwok": f"http://127.0.0.1:{ports[2]}/healthz",
            }
            for name, argv in argvs.items():
                if name == "kwok":
                    forget_node_leases(info)
                pid, start = _spawn(argv, _log(directory, name), directory)
                state.extras[name] = _ProcState(pid, start, argv)
                _write_state(directory, state)
            for name in argvs:
                _wait(directory, name, state.extras[name], ready[name], deadline)
            state.components = mode
            _write_state(directory, state)
        except BaseException:
            _stop_locked(directory, state)
            raise
    ensure_nodes(info, nodes)
    wait_nodes_ready(info, nodes, max(5.0, deadline - time.monotonic()))
    return server


def _kubeconfig(info: ControlPlaneInfo, state: _State, name: str, server: str) -> Path:
    user = IDENTITIES[name][0]
    return write_kubeconfig(
        info.dir / f"{name}.kubeconfig", server=server, ca_file=info.ca_file, user=user, token=state.tokens[name]
    )


def _start_proxy(
    info: ControlPlaneInfo, state: _State, config: Mapping[str, Any], admin_listen: str | None, deadline: float
) -> str:
    if admin_listen is None:
        admin_listen = f"127.0.0.1:{free_ports(1)[0]}"
    cfg = proxy_config(config, info, admin_listen)
    path = info.dir / "kproxy.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    argv = [sys.executable, "-m", "kproxy.cli", "run", "--config", str(path)]
    pid, start = _spawn(argv, _log(info.dir, "kproxy"), info.dir)
    state.extras["kproxy"] = _ProcState(pid, start, argv)
    _write_state(info.dir, state)
    _wait(info.dir, "kproxy", state.extras["kproxy"], f"http://{admin_listen}/readyz", deadline)
    url = _listen_url(cfg)
    # The admin's kubeconfig through kproxy, for people (kubectl) beside the components.
    write_kubeconfig(
        proxy_kubeconfig(info.dir), server=url, ca_file=info.ca_file, user="admin", token=state.admin_token
    )
    return url


def proxy_kubeconfig(directory: Path) -> Path:
    """``DIR/kproxy.kubeconfig``: the control plane's admin (a bearer token in system:masters) through kproxy."""
    return directory / "kproxy.kubeconfig"


@contextlib.contextmanager
def running_components(
    info: ControlPlaneInfo,
    *,
    mode: str,
    proxy: Mapping[str, Any] | None = None,
    nodes: int = 3,
    leader_elect: bool = False,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> Iterator[str]:
    """:func:`start_components` for a ``with`` block (leader election off: a restart need not wait for a lease)."""
    server = start_components(
        info, mode=mode, proxy=proxy, nodes=nodes, leader_elect=leader_elect, extra_args=extra_args
    )
    try:
        yield server
    finally:
        stop_components(info.dir)


def _stop_locked(directory: Path, state: _State, names: Sequence[str] = COMPONENTS, grace: float = 10.0) -> None:
    for name in reversed(COMPONENTS):
        proc = state.extras.get(name)
        if name in names and proc is not None:
            _terminate(proc.pid, proc.start_time, grace=grace)
            del state.extras[name]
    if not any(n in state.extras for n in COMPONENTS[1:]):
        state.components = None
    _write_state(directory, state)


def stop_components(directory: Path, names: Sequence[str] = COMPONENTS, *, grace: float = 10.0) -> None:
    """Stop the named components (default: all); the control plane and the nodes' objects stay."""
    with _dir_lock(directory):
        _stop_locked(directory, _require_state(directory), names, grace)


def component_pids(directory: Path) -> dict[str, int]:
    """The process ids of the running components (kproxy, the controllers, KWOK) and the apiserver."""
    state = _require_state(directory)
    pids = {name: proc.pid for name, proc in state.extras.items() if proc.pid is not None}
    if state.apiserver is not None and state.apiserver.pid is not None:
        pids["kube-apiserver"] = state.apiserver.pid
    return pids


def restart_component(info: ControlPlaneInfo, name: str, *, kill: bool = False, timeout: float = 60.0) -> None:
    """Stop one running component (SIGKILL with ``kill``) and start it again with the same command line."""
    with _dir_lock(info.dir):
        state = _require_state(info.dir)
        proc = state.extras.get(name)
        if proc is None:
            raise ControlPlaneError(f"{name} is not running in {info.dir}")
        _terminate(proc.pid, proc.start_time, kill=kill)
        if name == "kwok":
            forget_node_leases(info)
        proc.pid, proc.start_time = _spawn(proc.argv, _log(info.dir, name), info.dir)
        _write_state(info.dir, state)


def forget_node_leases(info: ControlPlaneInfo) -> None:
    """Delete the nodes' Leases before a kwok starts: a new kwok (a new lease holder) otherwise waits for
    the previous one's leases to expire (``--node-lease-duration-seconds``) before it moves their pods."""
    code, body = info.request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    if code not in (200, 404):
        raise ControlPlaneError(f"deleting the node leases: HTTP {code}: {body[:300]!r}")


def node_manifest(name: str) -> dict[str, Any]:
    """A simulated node kwok manages: capacity of a mid-size machine, no taints."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def ensure_nodes(info: ControlPlaneInfo, count: int, prefix: str = "kwok-node-") -> list[str]:
    """Create the simulated nodes ``prefix0`` .. ``prefix{count-1}`` that do not exist yet (as the admin)."""
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        code, body = info.request("POST", "/api/v1/nodes", body=json.dumps(node_manifest(name)).encode())
        if code not in (201, 409):
            raise ControlPlaneError(f"creating node {name}: HTTP {code}: {body[:300]!r}")
    return names


def nodes_ready(info: ControlPlaneInfo) -> dict[str, bool]:
    """Each kwok node's Ready condition, by name."""
    code, body = info.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
    if code != 200:
        raise ControlPlaneError(f"listing nodes: HTTP {code}: {body[:300]!r}")
    out = {}
    for node in json.loads(body)["items"]:
        conds = node.get("status", {}).get("conditions") or []
        out[node["metadata"]["name"]] = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
    return out


def wait_nodes_ready(info: ControlPlaneInfo, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(nodes_ready(info).values()) < count:
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"{count} kwok nodes not Ready in {timeout:.0f}s ({nodes_ready(info)}); kwok log tail:\n"
                f"{_tail(_log(info.dir, 'kwok'))}"
            )
        time.sleep(_POLL_INTERVAL)
