"""A control-plane directory's ``state.json`` (pids, ports, argv, tokens) and the lock that serializes changes to it."""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.localcluster import certs
from kproxy.localcluster.errors import ControlPlaneError
from kproxy.localcluster.processes import _alive

_STATE_FILE = "state.json"
_LOCK_FILE = ".envtest.lock"
_STATE_FORMAT = 1


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """Serialize up/down/restart on one directory across processes (flock is per open file)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / _LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@dataclass
class _ProcState:
    pid: int | None
    start_time: str | None
    argv: list[str]

    def alive(self) -> bool:
        """Whether this recorded process is still running (see :func:`kproxy.localcluster.processes._alive`)."""
        return _alive(self.pid, self.start_time)

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
    #: Bearer tokens of the living cluster's components (kube-controller-manager, kube-scheduler, kwok).
    tokens: dict[str, str] = field(default_factory=dict)
    #: The living cluster's processes by name (kproxy, kube-controller-manager, kube-scheduler, kwok),
    #: started by :mod:`kproxy.localcluster.cluster` and stopped before the apiserver.
    extras: dict[str, _ProcState] = field(default_factory=dict)
    #: How the components reach the apiserver ("proxied" through ``extras["kproxy"]``, "direct"), if running.
    components: str | None = None

    @property
    def ports(self) -> dict[str, int]:
        """The ports by role, as stored in state.json and shown by ``status``."""
        return {
            "apiserver": self.apiserver_port,
            "etcd_client": self.etcd_client_port,
            "etcd_peer": self.etcd_peer_port,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _STATE_FORMAT,
            "version": self.version,
            "kubectl": self.kubectl,
            "ports": self.ports,
            "user_token": self.user_token,
            "admin_token": self.admin_token,
            "etcd": self.etcd.to_json() if self.etcd else None,
            "apiserver": self.apiserver.to_json() if self.apiserver else None,
            "tokens": self.tokens,
            "extras": {name: proc.to_json() for name, proc in self.extras.items()},
            "components": self.components,
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
            tokens={str(k): str(v) for k, v in (d.get("tokens") or {}).items()},
            extras={str(k): _ProcState.from_json(v) for k, v in (d.get("extras") or {}).items()},
            components=d.get("components"),
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


def _remove_state(directory: Path) -> None:
    """Forget the control plane recorded in ``directory`` (its files stay)."""
    (directory / _STATE_FILE).unlink(missing_ok=True)


def _require_state(directory: Path) -> _State:
    state = _read_state(directory)
    if state is None:
        raise ControlPlaneError(f"no control plane state in {directory} (run up first)")
    return state
