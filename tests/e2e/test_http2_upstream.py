"""HTTP/2 from kproxy to the real apiserver: every verb, streamed lists, watches, large bodies and
errors as the apiserver answers them directly, callers' identities never mixed on shared
connections, and the connections kproxy holds to the apiserver counted on its process."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kproxy.localcluster import certs, envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.sockets import connections_to as upstream_connections


def _admin_ssl(cp: ControlPlaneInfo) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    ctx.load_cert_chain(str(cp.admin_cert), str(cp.admin_key))
    return ctx


async def _direct(cp: ControlPlaneInfo, method: str, path: str, **kw: Any) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, cp.server + path, ssl=_admin_ssl(cp), **kw) as r,
    ):
        return r.status, await r.read()


@pytest.fixture
def h2proxy(proxy_factory: Callable[..., RunningProxy]) -> RunningProxy:
    return proxy_factory()


def _cm(name: str, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data or {}}


async def test_every_verb_over_one_connection(
    h2proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    base = f"{h2proxy.url}/api/v1/namespaces/{namespace}/configmaps"
    async with aiohttp.ClientSession() as s:
        async with s.post(base, json=_cm("verbs", {"a": "1"})) as r:
            assert r.status == 201, await r.text()
            created = await r.json()
        async with s.get(f"{base}/verbs") as r:
            assert r.status == 200 and (await r.json())["data"] == {"a": "1"}
        async with s.head(f"{base}/verbs") as r:  # the apiserver's 405, its head only
            head_status = r.status
            assert await r.read() == b""
        assert (
            head_status == (await _direct(control_plane, "HEAD", f"/api/v1/namespaces/{namespace}/configmaps/verbs"))[0]
        )
        async with s.patch(
            f"{base}/verbs", data=b'{"data":{"b":"2"}}', headers={"Content-Type": "application/merge-patch+json"}
        ) as r:
            assert r.status == 200, await r.text()
        created["data"] = {"c": "3"}
        created["metadata"].pop("resourceVersion")
        async with s.put(f"{base}/verbs", json=created) as r:
            assert r.status == 200, await r.text()
        status, body = await _direct(control_plane, "GET", f"/api/v1/namespaces/{namespace}/configmaps/verbs")
        assert status == 200 and json.loads(body)["data"] == {"c": "3"}  # persisted, as the apiserver says
        async with s.get(base) as r:
            assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["verbs"]
        async with s.delete(f"{base}/verbs") as r:
            assert r.status == 200
        status, _ = await _direct(control_plane, "GET", f"/api/v1/namespaces/{namespace}/configmaps/verbs")
        assert status == 404
        # 30 requests at once, then: one connection carries them all.
        results = await asyncio.gather(*(s.get(f"{base}?limit=1") for _ in range(30)))
        for r in results:
            assert r.status == 200
            r.release()
    assert upstream_connections(h2proxy.proc.pid, control_plane.apiserver_port) == 1


async def test_streamed_list_and_watch(h2proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str) -> None:
    base = f"{h2proxy.url}/api/v1/namespaces/{namespace}/configmaps"
    async with aiohttp.ClientSession() as s:
        # A list larger than a read-whole answer (256 KiB), streamed on as it comes.
        for i in range(24):
            async with s.post(base, json=_cm(f"big-{i:02}", {"v": str(i) * 20000})) as r:
                assert r.status == 201
        async with s.get(base) as r:
            via = await r.read()
        status, direct = await _direct(control_plane, "GET", f"/api/v1/namespaces/{namespace}/configmaps")
        assert status == 200 and len(via) > 400_000
        assert json.loads(via)["items"] == json.loads(direct)["items"]
        rv = json.loads(via)["metadata"]["resourceVersion"]
        async with s.get(base, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "30"}) as w:
            assert w.status == 200
            async with s.post(base, json=_cm("watched")) as r:
                assert r.status == 201
            event = json.loads(await asyncio.wait_for(w.content.readline(), 20))
            assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "watched"
            # The big list again while the watch is open: both on the one connection.
            async with s.get(base) as r:
                assert len(await r.read()) > 400_000
            assert upstream_connections(h2proxy.proc.pid, control_plane.apiserver_port) == 1
        # Half a megabyte of ConfigMaps is not left to the tests that cache every ConfigMap after.
        async with s.delete(base) as r:
            assert r.status == 200


async def test_large_request_bodies(h2proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    big = json.dumps(_cm("huge", {"v": "x" * (10 << 20)})).encode()
    async with aiohttp.ClientSession() as s:
        # A watch stays open meanwhile: the bodies go on its connection, beside it.
        watch = await s.get(h2proxy.url + path, params={"watch": "1", "timeoutSeconds": "60"})
        assert watch.status == 200
        async with s.post(h2proxy.url + path, data=big, headers={"Content-Type": "application/json"}) as r:
            via = (r.status, await r.read())
        # Under the apiserver's own limit: a 2.5 MiB body goes through whole (the object is then
        # too large for etcd, which the apiserver says after reading all of it).
        mid = json.dumps(_cm("mid", {"v": "y" * (5 << 19)})).encode()
        async with s.post(h2proxy.url + path, data=mid, headers={"Content-Type": "application/json"}) as r:
            via_mid = (r.status, await r.read())
        held = upstream_connections(h2proxy.proc.pid, control_plane.apiserver_port)
        watch.close()
    assert held == 1
    direct = await _direct(control_plane, "POST", path, data=big, headers={"Content-Type": "application/json"})
    direct_mid = await _direct(control_plane, "POST", path, data=mid, headers={"Content-Type": "application/json"})
    assert via[0] == direct[0] == 413
    assert json.loads(via[1]) == json.loads(direct[1])
    assert via_mid[0] == direct_mid[0] and json.loads(via_mid[1])["message"] == json.loads(direct_mid[1])["message"]
    status, _ = await _direct(control_plane, "GET", f"{path}/huge")
    assert status == 404


@pytest.fixture(scope="module")
def compacting_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A control plane of this module's own whose apiserver compacts etcd every second (the
    shared one compacts every 5 min): its continue tokens expire while the test waits."""
    directory = tmp_path_factory.mktemp("cp-h2-compaction")
    cp = envtest.up(directory, apiserver_args=["--etcd-compaction-interval=1s"])
    try:
        yield cp
    finally:
        envtest.down(directory)


def test_expired_continue_is_410_as_directly(compacting_cp: ControlPlaneInfo, tmp_path: Path) -> None:
    cp = compacting_cp
    rp = start_proxy(tmp_path / "kproxy", cp.admin_kubeconfig)
    try:
        assert cp.request("POST", "/api/v1/namespaces", body=json.dumps(_ns("h2-gone")).encode())[0] == 201
        path = "/api/v1/namespaces/h2-gone/configmaps"
        for name in ("a", "b"):
            assert cp.request("POST", path, body=json.dumps(_cm(name)).encode())[0] == 201
        code, page = cp.request("GET", f"{path}?limit=1")
        assert code == 200
        token = json.loads(page)["metadata"]["continue"]
        for i in range(3):  # newer revisions, which the compactor compacts the token's away under
            assert cp.request("POST", path, body=json.dumps(_cm(f"later-{i}")).encode())[0] == 201
        target = f"{path}?limit=1&continue={token}"
        eventually(lambda: cp.request("GET", target)[0] == 410, 60, "the apiserver to expire the token")
        direct = cp.request("GET", target)
        via = rp.get(target)
        # kproxy's readiness probe and this request went on one connection.
        assert via[0] == direct[0] == 410
        assert json.loads(via[1]) == json.loads(direct[1])  # the apiserver's Status, word for word
        assert upstream_connections(rp.proc.pid, cp.apiserver_port) == 1
    finally:
        rp.stop()


def _ns(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


async def _open_watches(url: str, n: int, session: aiohttp.ClientSession) -> list[aiohttp.ClientResponse]:
    async def one() -> aiohttp.ClientResponse:
        r = await session.get(url, params={"watch": "1", "timeoutSeconds": "120"})
        assert r.status == 200
        return r

    return list(await asyncio.gather(*(one() for _ in range(n))))


@pytest.mark.parametrize("http2", [True, False])
async def test_watches_share_connections_unless_http2_is_off(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str, http2: bool
) -> None:
    rp = proxy_factory(extra={"upstream": {"http2": http2}})
    url = f"{rp.url}/api/v1/namespaces/{namespace}/secrets"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        watches = await _open_watches(url, 20, s)
        held = upstream_connections(rp.proc.pid, control_plane.apiserver_port)
        for w in watches:
            w.close()
    if http2:
        assert held == 1
    else:
        assert held >= 20  # HTTP/1.1: one connection per open watch


async def test_connections_stay_few_under_many_watches_and_requests(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    # kproxy's own lists and watches (the watch cache of configmaps) share the connections too.
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["configmaps"]}]})
    rp.wait_cached(f"/api/v1/namespaces/{namespace}/configmaps", "configmaps")
    url = f"{rp.url}/api/v1/namespaces/{namespace}/secrets"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        watches = await _open_watches(url, 300, s)
        # 50 requests at once beside them: 351 streams in all, within 4 connections of 100.
        gets = await asyncio.gather(*(s.get(f"{rp.url}/api/v1/namespaces/{namespace}") for _ in range(50)))
        for g in gets:
            assert g.status == 200
            g.release()
        held = upstream_connections(rp.proc.pid, control_plane.apiserver_port)
        # Every watch is still open and live: a new secret reaches the first and the last.
        async with s.post(
            url, json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "seen"}, "stringData": {"a": "b"}}
        ) as r:
            assert r.status == 201
        for w in (watches[0], watches[-1]):
            event = json.loads(await asyncio.wait_for(w.content.readline(), 20))
            assert event["object"]["metadata"]["name"] == "seen"
        for w in watches:
            w.close()
    assert 3 <= held <= 4, held  # 300 streams at the apiserver's 100 per connection


async def test_concurrent_identities_each_get_their_own_answer(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    caller_ca = certs.generate_ca("kproxy-callers-ca")
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", caller_ca.cert_pem, private=False)
    # Listed as allowed: kproxy asks no SubjectAccessReviews about them (impersonate.py AdminCheck),
    # so the callers' own requests are all there is.
    rp = proxy_factory(
        credentials="impersonate",
        tls=True,
        extra={
            "tls": {"client_ca_file": str(ca_file)},
            "impersonate": {"allowed_privileged_groups": ["h2-callers"]},
        },
    )

    contexts = []
    for i in range(50):
        leaf = certs.generate_client_cert(caller_ca, f"caller-{i}", [f"team-{i}", f"unit-{i % 7}", "h2-callers"])
        crt = certs.write_pem(tmp_path / f"c{i}.crt", leaf.cert_pem, private=False)
        key = certs.write_pem(tmp_path / f"c{i}.key", leaf.key_pem, private=True)
        ctx = ssl.create_default_context(cafile=str(rp.ca_file))
        ctx.load_cert_chain(str(crt), str(key))
        contexts.append(ctx)

    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    url = f"{rp.url}/apis/authentication.k8s.io/v1/selfsubjectreviews"

    async def ask(i: int, s: aiohttp.ClientSession) -> dict[str, Any]:
        async with s.post(url, json=review, ssl=contexts[i]) as r:
            assert r.status == 201, await r.text()
            return dict((await r.json())["status"]["userInfo"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        for _round in range(3):
            answers = await asyncio.gather(*(ask(i, s) for i in range(50)))
            for i, info in enumerate(answers):
                # The apiserver names each caller as itself: no header of another caller's request.
                assert info["username"] == f"caller-{i}"
                assert sorted(info["groups"]) == sorted(
                    [f"team-{i}", f"unit-{i % 7}", "h2-callers", "system:authenticated"]
                )
    assert upstream_connections(rp.proc.pid, control_plane.apiserver_port) == 1
