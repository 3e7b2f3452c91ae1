"""kproxy processes with each policy filter in front of the shared control plane, a pair of
namespaces (one reached through kproxy, its twin reached directly with the same bytes), and a
memory cap on every kproxy started here so that a decoding bomb fails a test, not the machine."""

from __future__ import annotations

import json
import resource
import secrets
import signal
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

from .wire import Endpoint

#: Address space a kproxy under hostile input may grow by before its allocations fail.
MEMORY_HEADROOM = 768 << 20

POLICY_FILTERS: dict[str, list[dict[str, Any]]] = {
    "enforce": [{"name": "dryrun", "rules": [{"name": "adv", "action": "enforce"}]}],
    "reject": [{"name": "dryrun", "rules": [{"name": "adv", "action": "reject"}]}],
    "strict": [{"name": "validation", "rules": [{"name": "adv", "level": "Strict"}]}],
}


def cap_memory(rp: RunningProxy, headroom: int = MEMORY_HEADROOM) -> None:
    """Limit the running kproxy's address space to what it uses now plus ``headroom``."""
    vm = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{rp.proc.pid}/status").read_text().splitlines()
        if line.startswith("VmSize:")
    )
    resource.prlimit(rp.proc.pid, resource.RLIMIT_AS, (vm + headroom, vm + headroom))


def start_capped(tmp: Path, cp: ControlPlaneInfo, **kwargs: Any) -> RunningProxy:
    rp = start_proxy(tmp, kwargs.pop("upstream_kubeconfig", cp.admin_kubeconfig), **kwargs)
    cap_memory(rp)
    return rp


@pytest.fixture(scope="session")
def policy_proxies(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], RunningProxy]]:
    """``get(policy)``: the session's kproxy for ``enforce``, ``reject`` or ``strict`` (started on first use)."""
    started: dict[str, RunningProxy] = {}

    def get(policy: str) -> RunningProxy:
        if policy not in started:
            started[policy] = start_capped(
                tmp_path_factory.mktemp(f"adv-{policy}"), control_plane, extra={"filters": POLICY_FILTERS[policy]}
            )
        return started[policy]

    yield get
    for rp in started.values():
        rp.stop(signal.SIGKILL)


@pytest.fixture
def capped_factory(tmp_path: Path, control_plane: ControlPlaneInfo) -> Iterator[Callable[..., RunningProxy]]:
    """Extra kproxy processes for one test, memory-capped, killed afterwards (a bomb may have wedged them)."""
    started: list[RunningProxy] = []

    def make(**kwargs: Any) -> RunningProxy:
        rp = start_capped(tmp_path / f"p{len(started)}", control_plane, **kwargs)
        started.append(rp)
        return rp

    yield make
    for rp in started:
        rp.stop(signal.SIGKILL)


@dataclass
class Twins:
    """A namespace reached through kproxy and its twin reached directly; same-length names, so
    the same request bytes (namespace substituted) have the same length on both sides."""

    cp: ControlPlaneInfo
    via: str
    direct: str
    sa: str = "adv-sa"

    @property
    def direct_endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.cp.apiserver_port, self.cp.ssl_context())

    def seed(self, name: str) -> None:
        """The same ConfigMap ``name`` in both namespaces."""
        for ns in (self.via, self.direct):
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}
            code, resp = self.cp.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=json.dumps(body).encode())
            assert code == 201, resp

    def get(self, path: str) -> dict[str, Any] | None:
        code, resp = self.cp.request("GET", path)
        if code == 404:
            return None
        assert code == 200, resp
        out: dict[str, Any] = json.loads(resp)
        return out


def _namespace(cp: ControlPlaneInfo, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, resp = cp.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
    assert code == 201, resp


@pytest.fixture(scope="session")
def twins(control_plane: ControlPlaneInfo) -> Iterator[Twins]:
    tag = secrets.token_hex(3)
    t = Twins(control_plane, f"adv-k-{tag}", f"adv-d-{tag}")
    for ns in (t.via, t.direct):
        _namespace(control_plane, ns)
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": t.sa}}
        code, resp = control_plane.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                                           body=json.dumps(sa).encode())  # fmt: skip
        assert code == 201, resp
    yield t
    for ns in (t.via, t.direct):
        control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
def caller_ca() -> certs.CertKey:
    """The CA of the callers' client certificates, which ``imp`` trusts."""
    return certs.generate_ca("adv-callers-ca")


@pytest.fixture(scope="module")
def imp(
    control_plane: ControlPlaneInfo, caller_ca: certs.CertKey, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy in ``impersonate`` mode over TLS, its callers certificates from ``caller_ca``."""
    tmp = tmp_path_factory.mktemp("adv-imp")
    ca_file = certs.write_pem(tmp / "callers-ca.crt", caller_ca.cert_pem, private=False)
    rp = start_capped(tmp / "p", control_plane, credentials="impersonate", tls=True,
                      extra={"tls": {"client_ca_file": str(ca_file)}})  # fmt: skip
    yield rp
    rp.stop()


def caller_context(rp: RunningProxy, ca: certs.CertKey, tmp: Path, cn: str, groups: list[str]) -> ssl.SSLContext:
    """A TLS client context for ``rp`` presenting a certificate from ``ca`` for ``cn`` in ``groups``."""
    leaf = certs.generate_client_cert(ca, cn, groups)
    crt = certs.write_pem(tmp / "c.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp / "c.key", leaf.key_pem, private=True)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    ctx.load_cert_chain(str(crt), str(key))
    return ctx
