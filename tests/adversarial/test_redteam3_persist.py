"""The watch cache on disk, attacked from outside: state persisted for one cluster must never be
served for another cluster reached at the same server URL.

A node-local kproxy reaches its cluster as ``https://kubernetes.default.svc`` (every cluster's
in-cluster address) and keeps its state in a hostPath: a node moved to another cluster, or a disk
image reused, starts kproxy on the old cluster's files. The persisted state is keyed by the server
URL alone, so the new kproxy (another cluster's CA and credentials in its kubeconfig) loads it and
answers ``resourceVersion=0`` reads with the other cluster's objects. The judge is the second
cluster's apiserver: the namespace served from disk does not exist there.

The clusters here: the session's, and a control plane of this module's own, both reached through
one toxiproxy address (the same URL) whose upstream is switched between them.
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import start_proxy
from kproxy.testing.toxiproxy import Toxiproxy, rewrite_kubeconfig

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def other_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    directory = tmp_path_factory.mktemp("redteam3-persist-envtest")
    try:
        yield envtest.up(directory)
    finally:
        envtest.down(directory)


@pytest.fixture
def toxi(tmp_path: Path) -> Iterator[Toxiproxy]:
    t = Toxiproxy(tmp_path / "toxiproxy.log")
    yield t
    t.stop()


def _config(state: Path) -> dict[str, Any]:
    return {"filters": [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(state)}}]}


def _names(body: bytes) -> set[str]:
    return {i["metadata"]["name"] for i in json.loads(body).get("items") or []}


def test_state_of_another_cluster_at_the_same_url_is_not_served(
    control_plane: ControlPlaneInfo, other_cp: ControlPlaneInfo, toxi: Toxiproxy, tmp_path: Path
) -> None:
    first, second = control_plane, other_cp
    door = toxi.proxy("door", f"127.0.0.1:{first.apiserver_port}")
    url = f"https://{door}"
    first_kc = rewrite_kubeconfig(first.admin_kubeconfig, tmp_path / "first.kubeconfig", url)
    second_kc = rewrite_kubeconfig(second.admin_kubeconfig, tmp_path / "second.kubeconfig", url)
    ns = f"rt3-persist-{secrets.token_hex(3)}"
    assert first.request("POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": ns}}).encode())[0] == 201
    base = f"/api/v1/namespaces/{ns}/configmaps"
    state = tmp_path / "state"
    try:
        for i in range(3):
            body = json.dumps({"metadata": {"name": f"first-{i}"}, "data": {"secret-ish": "of the first cluster"}})
            assert first.request("POST", base, body=body.encode())[0] == 201
        rp = start_proxy(tmp_path / "run1", first_kc, extra=_config(state))
        try:

            def cached() -> bool:
                status, body = rp.get(f"{base}?resourceVersion=0")
                return status == 200 and len(_names(body)) == 3 and 'served="cache"' in rp.metrics()

            eventually(cached, 60, "the first cluster's configmaps cached")
        finally:
            assert rp.stop() == 0
        assert (state / "core+v1+configmaps.snapshot").exists()

        # The same URL now leads to the second cluster, which is not answering yet (a node's
        # kproxy starting before its link is up: what is on disk is all it has).
        toxi._call("POST", "/proxies/door", {"upstream": f"127.0.0.1:{second.apiserver_port}", "enabled": False})
        rp = start_proxy(tmp_path / "run2", second_kc, extra=_config(state), ready=False)
        try:
            status, body = rp.get(f"{base}?resourceVersion=0", timeout=20)
            leaked = _names(body) if status == 200 else set()
        finally:
            rp.stop(signal.SIGKILL)
        # The judge: the second cluster has no such namespace.
        assert second.request("GET", base)[0] == 200 and not _names(second.request("GET", base)[1])
        assert not leaked, f"the first cluster's objects served for the second: {sorted(leaked)}"
    finally:
        first.request("DELETE", base)
        first.request("DELETE", f"/api/v1/namespaces/{ns}")


def test_a_directory_in_use_is_refused_and_its_owner_goes_on(control_plane: ControlPlaneInfo, tmp_path: Path) -> None:
    """Two kproxies on one directory would each rewrite and remove the other's files: the second
    is refused at start, and the first keeps serving and persisting."""
    state = tmp_path / "state"
    owner = start_proxy(tmp_path / "owner", control_plane.admin_kubeconfig, extra=_config(state))
    try:
        with pytest.raises(AssertionError, match="persist: dir .* is in use by another kproxy process"):
            start_proxy(tmp_path / "second", control_plane.admin_kubeconfig, extra=_config(state))
        owner.wait_cached("/api/v1/configmaps", "configmaps", timeout=90)
        assert (state / "core+v1+configmaps.snapshot").exists()
    finally:
        assert owner.stop() == 0


def test_planted_symbolic_links_are_never_followed(control_plane: ControlPlaneInfo, tmp_path: Path) -> None:
    """A symbolic link planted where kproxy reads or writes its state (another file of its user's,
    a snapshot of another directory) is neither read nor written through: the state is listed
    again from the apiserver and the link's target is unchanged."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"not kproxy's")
    victim.chmod(0o600)
    (state / "core+v1+configmaps.snapshot").symlink_to(victim)
    (state / "core+v1+configmaps.snapshot.tmp").symlink_to(victim)
    rp = start_proxy(tmp_path / "run", control_plane.admin_kubeconfig, extra=_config(state))
    try:
        rp.wait_cached("/api/v1/configmaps", "configmaps", timeout=90)
        snapshot = state / "core+v1+configmaps.snapshot"
        eventually(lambda: snapshot.exists() and not snapshot.is_symlink(), 30, "a snapshot of kproxy's own")
    finally:
        assert rp.stop() == 0
    assert victim.read_bytes() == b"not kproxy's"
