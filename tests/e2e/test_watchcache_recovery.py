"""The watch cache recovers from an upstream outage: the apiserver killed, etcd compacted while it is
down, the apiserver started again. kproxy's watch resumes from a resource version the new apiserver
no longer has (410 Expired), lists again, reconciles, and converges to exactly the upstream's state.

Also: with ``resources: ["*"]`` a custom resource definition created at run time is cached once
discovery shows it, and dropped when the definition is deleted."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from watchcache_diff import reads_total

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def _compact(cp: ControlPlaneInfo) -> int:
    """Compact etcd at its current revision (through etcd's own JSON gateway)."""
    revision = cp.etcd_revision()
    cp.compact_etcd(revision)
    return revision


def _state(items: list[dict[str, object]]) -> dict[str, str]:
    return {
        f"{i['metadata']['namespace']}/{i['metadata']['name']}": str(i["metadata"]["resourceVersion"])  # type: ignore[index]
        for i in items
    }


def _via(rp: RunningProxy, path: str) -> dict[str, str] | None:
    status, body = rp.get(path)
    if status != 200:
        return None
    return _state(json.loads(body)["items"])


def _from_cache(rp: RunningProxy, path: str, resource: str) -> dict[str, str] | None:
    """The list through kproxy, only when its cache answered it (a cache that is not ready sends
    reads to the apiserver, whose answer would match without saying anything about the cache)."""
    before = reads_total(rp.metrics(), resource=resource, verb="list", served="cache")
    state = _via(rp, path)
    return state if reads_total(rp.metrics(), resource=resource, verb="list", served="cache") > before else None


def _direct(cp: ControlPlaneInfo, path: str) -> dict[str, str]:
    status, body = cp.request("GET", path)
    assert status == 200, body
    return _state(json.loads(body)["items"])


def _metric(rp: RunningProxy, pattern: str) -> float:
    m = re.search(pattern + r" ([0-9.e+]+)", rp.metrics())
    return float(m.group(1)) if m else 0.0


def _cm(name: str, value: str) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}
    ).encode()


def test_outage_and_compaction_relist_and_converge(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cp = control_plane
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(5):
        assert cp.request("POST", base, body=_cm(f"cm{i}", "a"))[0] == 201
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["configmaps", "secrets"]}]})
    listing = f"{base}?resourceVersion=0"
    eventually(
        lambda: _from_cache(rp, listing, "configmaps") == _direct(cp, base), 30, "the cache to hold the configmaps"
    )
    secrets = f"/api/v1/namespaces/{namespace}/secrets"
    eventually(lambda: _from_cache(rp, f"{secrets}?resourceVersion=0", "secrets") == {}, 30, "the secrets cache")

    # The etcd head moves on (other resources) while the configmaps cache stays where it was.
    for i in range(3):
        body = json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"s{i}"}}).encode()
        assert cp.request("POST", secrets, body=body)[0] == 201
    cp.stop_apiserver(kill=True)
    try:
        _compact(cp)
    finally:
        cp.start_apiserver()
    # Changes the cache has to catch up on: one modified, one deleted, one created.
    assert cp.request("PUT", f"{base}/cm1", body=_cm("cm1", "b"))[0] == 200
    assert cp.request("DELETE", f"{base}/cm2")[0] == 200
    assert cp.request("POST", base, body=_cm("cm9", "c"))[0] == 201

    def converged() -> bool:
        return _from_cache(rp, listing, "configmaps") == _direct(cp, base)

    eventually(converged, 60, "the cache to converge to the apiserver's state after the outage")
    relists = [line for line in rp.metrics().splitlines() if "relists_total{" in line]
    assert _metric(rp, r'kproxy_watchcache_relists_total\{reason="expired",resource="configmaps"\}') >= 1, relists
    # Consistent reads through the cache see later writes at once.
    assert cp.request("DELETE", f"{base}/cm3")[0] == 200
    assert _via(rp, base) == _direct(cp, base)
    assert "cm3" not in str(_via(rp, base))


CRD = crds.crd(
    "wc.kproxy.test", "gizmos", "Gizmo", spec_fields={"color": "string", "n": "integer"}, selectable=[".spec.color"]
)


def test_wildcard_follows_custom_resource_definitions(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["*"]}]})
    eventually(lambda: 'resource="configmaps"' in rp.metrics(), 30, "discovery to fill the cache")
    crds.install(cp, CRD)
    try:
        base = f"/apis/wc.kproxy.test/v1/namespaces/{namespace}/gizmos"

        def create(name: str, color: str) -> bool:
            body = {"apiVersion": "wc.kproxy.test/v1", "kind": "Gizmo", "metadata": {"name": name}}
            body["spec"] = {"n": 1, "color": color}
            return cp.request("POST", base, body=json.dumps(body).encode())[0] in (201, 409)

        eventually(lambda: create("g1", "red"), 30, "the CRD to be served")
        assert create("g2", "blue")
        eventually(
            lambda: _metric(rp, r'kproxy_watchcache_objects\{resource="gizmos.wc.kproxy.test"\}') >= 2,
            30,
            "kproxy to cache the new custom resource",
        )
        status, via = rp.get(f"{base}?resourceVersion=0")
        direct = cp.request("GET", f"{base}?resourceVersion=0")
        assert status == 200 and (status, via) == direct
        assert (
            _metric(
                rp,
                r'kproxy_watchcache_reads_total\{reason="any",resource="gizmos.wc.kproxy.test",served="cache",verb="list"\}',
            )
            == 1
        )
    finally:
        crds.uninstall(cp, "gizmos.wc.kproxy.test")
    gone = f"/apis/wc.kproxy.test/v1/namespaces/{namespace}/gizmos?resourceVersion=0"
    # Once discovery no longer has it, kproxy drops the cache and the apiserver's own 404 comes back.
    eventually(lambda: rp.get(gone)[0] == 404, 30, "kproxy to drop the deleted custom resource's cache")
    assert rp.get(gone) == cp.request("GET", gone)


def test_named_custom_resource_installed_later_and_removed(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """A configured custom resource whose definition is not there yet does not hold up the
    others; it is cached once installed, and after its definition is deleted reads get the
    apiserver's own 404 again (the cache stops answering)."""
    cp = control_plane
    crd = crds.crd("wc.kproxy.test", "gadgets", "Gadget")
    rp = proxy_factory(
        extra={"filters": [{"name": "watchcache", "resources": ["configmaps", "gadgets.wc.kproxy.test"]}]}
    )
    cms = f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0"
    eventually(
        lambda: rp.get(cms)[0] == 200 and 'resource="configmaps",served="cache"' in rp.metrics(), 30, "configmaps"
    )
    base = f"/apis/wc.kproxy.test/v1/namespaces/{namespace}/gadgets"
    assert rp.get(f"{base}?resourceVersion=0") == cp.request("GET", f"{base}?resourceVersion=0")  # 404 both
    crds.install(cp, crd)
    try:
        body = {"apiVersion": "wc.kproxy.test/v1", "kind": "Gadget", "metadata": {"name": "g1"}, "spec": {"n": 1}}
        eventually(
            lambda: cp.request("POST", base, body=json.dumps(body).encode())[0] in (201, 409), 30, "the CRD served"
        )
        cached = r'kproxy_watchcache_reads_total\{reason="any",resource="gadgets.wc.kproxy.test",served="cache"'
        eventually(
            lambda: b'"g1"' in rp.get(f"{base}?resourceVersion=0")[1] and _metric(rp, cached + r',verb="list"\}') > 0,
            40,
            "kproxy to cache the custom resource once it is installed",
        )
    finally:
        crds.uninstall(cp, "gadgets.wc.kproxy.test")
    gone = f"{base}?resourceVersion=0"
    eventually(lambda: rp.get(gone)[0] == 404, 40, "reads of the removed resource to get the apiserver's 404")
    assert rp.get(gone) == cp.request("GET", gone)
