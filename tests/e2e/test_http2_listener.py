"""HTTP/2 on kproxy's TLS listener, next to the apiserver's own.

Clients that offer ``h2`` (kubectl, client-go, curl) get an HTTP/2 connection from kproxy as from
the apiserver: the same first SETTINGS, every request a stream through the same chain, watches
flushed per event, bodies larger than a window under flow control, each stream's caller
identified on its own, GOAWAY on a drain and on an idle connection."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from h2client import H2Client, Response

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually, eventually_async
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy


def _forward(proxy_factory: Callable[..., RunningProxy], cp: ControlPlaneInfo, **extra: Any) -> RunningProxy:
    return proxy_factory(credentials="forward", tls=True, token=cp.admin_token, extra=extra)


def _bearer(token: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {token}")


async def _first_settings(url: str, ca: str | None) -> tuple[dict[int, int], int]:
    client = await H2Client.connect(url, ca)
    try:
        await client.request("GET", "/version")  # by now the connection's WINDOW_UPDATE is in
        return client.server_settings, client.conn.outbound_flow_control_window
    finally:
        await client.close()


async def test_first_settings_and_windows_are_the_apiservers(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy]
) -> None:
    rp = _forward(proxy_factory, control_plane)
    theirs = await _first_settings(control_plane.server, None)
    ours = await _first_settings(rp.url, str(rp.ca_file))
    assert ours == theirs
    assert theirs[0][3] == 100  # MAX_CONCURRENT_STREAMS, the number the docs give


async def test_kubectl_speaks_h2_to_kproxy_and_every_verb_works(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    rp = _forward(proxy_factory, control_plane)

    def kubectl(*args: str, input: str | None = None) -> str:
        out = subprocess.run(
            [str(control_plane.kubectl), f"--kubeconfig={rp.kubeconfig}", "-n", namespace, *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    kubectl("create", "configmap", "one", "--from-literal=a=1")
    kubectl("patch", "configmap", "one", "-p", '{"data":{"b":"2"}}')
    cm = json.loads(kubectl("get", "configmap", "one", "-o", "json"))
    cm["data"]["c"] = "3"
    kubectl("replace", "-f", "-", input=json.dumps(cm))
    kubectl("label", "configmap", "one", "x=y")
    assert "one" in kubectl("get", "configmaps", "-l", "x=y", "-o", "name")
    admin = [str(control_plane.kubectl), f"--kubeconfig={control_plane.admin_kubeconfig}", "-n", namespace]
    got = subprocess.run([*admin, "get", "configmap", "one", "-o", "json"], capture_output=True, text=True, check=True)
    stored = json.loads(got.stdout)
    assert stored["data"] == {"a": "1", "b": "2", "c": "3"} and stored["metadata"]["labels"] == {"x": "y"}
    kubectl("delete", "configmap", "one")
    lines = [json.loads(line) for line in rp.log_text().splitlines() if line.startswith("{")]
    ours = [line for line in lines if line.get("logger") == "kproxy.access" and namespace in line["msg"]]
    assert ours, "no access log lines for the test's requests"
    assert {line["protocol"] for line in ours} == {"HTTP/2.0"}


async def test_streams_of_one_connection_are_identified_each_by_its_own_token(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """A gateway in front of kproxy may multiplex many callers on one connection: each stream's
    caller is the one its own Authorization names (the apiserver's SelfSubjectReview says who)."""
    rp = proxy_factory(credentials="impersonate", tls=True)
    users = {control_plane.user_token: control_plane.user_name}
    for name in ("alice", "bob"):
        kubectl(["-n", namespace, "create", "serviceaccount", name])
        token = kubectl(["-n", namespace, "create", "token", name]).stdout.strip()
        users[token] = f"system:serviceaccount:{namespace}:{name}"
    tokens = list(users) * 15
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    try:
        answers = await asyncio.gather(
            *(
                client.request(
                    "POST",
                    "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                    [_bearer(tok), ("content-type", "application/json")],
                    review,
                )
                for tok in tokens
            )
        )
    finally:
        await client.close()
    assert all(a.status == 201 for a in answers), [bytes(a.body)[:200] for a in answers if a.status != 201]
    names = [json.loads(bytes(a.body))["status"]["userInfo"]["username"] for a in answers]
    assert names == [users[tok] for tok in tokens]


async def test_watch_events_arrive_one_by_one_on_a_stream(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """A watch passed through and one served from the cache, both on one connection: each event
    reaches the client while the watch stays open."""
    rp = _forward(proxy_factory, control_plane, filters=[{"name": "watchcache", "resources": ["configmaps"]}])
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    auth = [_bearer(control_plane.admin_token)]
    try:
        cached = client.open("GET", f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion=0", auth)
        upstream = client.open("GET", f"/api/v1/namespaces/{namespace}/secrets?watch=1", auth)
        for sid in (cached, upstream):
            await asyncio.wait_for(client.responses[sid].headers_in.wait(), 30)
            assert client.responses[sid].status == 200
        for i in range(3):
            kubectl(["-n", namespace, "create", "configmap", f"c{i}"])
            kubectl(["-n", namespace, "create", "secret", "generic", f"s{i}"])

            def seen(sid: int, name: str) -> bool:
                return name.encode() in bytes(client.responses[sid].body)

            await eventually_async(
                lambda i=i: seen(cached, f'"c{i}"') and seen(upstream, f'"s{i}"'),
                30,
                "both watches to deliver the write",
                0.02,
            )
        for sid in (cached, upstream):
            assert not client.responses[sid].ended.is_set()
            events = [json.loads(x) for x in bytes(client.responses[sid].body).splitlines() if x.strip()]
            assert {e["type"] for e in events} <= {"ADDED", "BOOKMARK"}
    finally:
        await client.close()


async def test_a_body_larger_than_the_windows_arrives_whole(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """900 KiB, more than three stream windows: kproxy gives the window back as the chain reads
    the body, and the apiserver stores every byte."""
    rp = _forward(proxy_factory, control_plane)
    payload = base64.b64encode(os.urandom(675 * 1024)).decode()
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"p": payload}}
    ).encode()
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        resp = await client.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            [_bearer(control_plane.admin_token), ("content-type", "application/json")],
            body,
        )
    finally:
        await client.close()
    assert resp.status == 201, bytes(resp.body)[:300]
    stored = json.loads(kubectl(["-n", namespace, "get", "configmap", "big", "-o", "json"]).stdout)
    assert stored["data"]["p"] == payload


async def test_drain_sends_goaway_and_lets_streams_end_cleanly(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    """SIGTERM: the client learns by GOAWAY (NO_ERROR) that it must open new streams elsewhere;
    its open watch ends with END_STREAM (client-go then re-establishes it), not a reset."""
    rp = _forward(proxy_factory, control_plane)
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        watch = client.open(
            "GET", f"/api/v1/namespaces/{namespace}/configmaps?watch=1", [_bearer(control_plane.admin_token)]
        )
        await asyncio.wait_for(client.responses[watch].headers_in.wait(), 30)
        rp.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(client.goaway_in.wait(), 20)
        assert client.goaway is not None
        assert client.goaway.error_code == 0 and client.goaway.last_stream_id >= watch
        await asyncio.wait_for(client.responses[watch].ended.wait(), 20)
        assert client.responses[watch].reset is None
        await asyncio.wait_for(client.closed.wait(), 20)
    finally:
        await client.close()
    assert rp.proc.wait(30) == 0


def _configmap(name: str) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}).encode()


def _events(resp: Response) -> list[dict[str, Any]]:
    """The watch events of a stream's body: every line a whole JSON event (a cut one fails)."""
    return [json.loads(line) for line in bytes(resp.body).splitlines() if line.strip()]


async def test_reload_sends_goaway_and_watches_move_to_a_connection_on_the_new_chain(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """A config reload (SIGHUP): each HTTP/2 client gets GOAWAY (NO_ERROR, last stream the highest
    it opened), as on a drain. Its request in flight, begun on the old chain, gets the apiserver's
    answer even once the drain's deadline (``shutdown_timeout``) has passed; its watch ends
    cleanly after whole events, so client-go watches again on a new connection, which the new
    chain serves."""
    rp = _forward(
        proxy_factory,
        control_plane,
        reload_interval="0s",
        shutdown_timeout="1s",
        filters=[{"name": "readonly", "allow_namespaces": [namespace]}],
    )
    auth = [_bearer(control_plane.admin_token)]
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        watch = client.open("GET", f"{configmaps}?watch=1", auth)
        await asyncio.wait_for(client.responses[watch].headers_in.wait(), 30)
        kubectl(["-n", namespace, "create", "configmap", "before-reload"])
        await eventually_async(
            lambda: b'"before-reload"' in bytes(client.responses[watch].body),
            30,
            "the watch's event before the reload",
            0.02,
        )
        # A create whose body is still on its way when the reload comes.
        create = client.open("POST", configmaps, [*auth, ("content-type", "application/json")], end=False)
        body = _configmap("in-flight")
        client.conn.send_data(create, body[:10])
        client.flush()
        await eventually_async(
            lambda: "kproxy_requests_in_flight 1.0" in rp.metrics(), 30, "one request in flight", 0.02
        )

        rp.write_config({"filters": [{"name": "readonly", "allow_namespaces": ["elsewhere"]}]})
        rp.proc.send_signal(signal.SIGHUP)
        await asyncio.wait_for(client.goaway_in.wait(), 20)
        assert client.goaway is not None
        assert (client.goaway.error_code, client.goaway.last_stream_id) == (0, create)
        await asyncio.wait_for(client.responses[watch].ended.wait(), 20)
        assert client.responses[watch].reset is None
        assert [e["object"]["metadata"]["name"] for e in _events(client.responses[watch])] == ["before-reload"]

        # Past the drain's deadline, the request in flight still gets its answer.
        eventually(lambda: "HTTP/2 connections still serving" in rp.log_text(), 20, "the reload's drain deadline")
        assert not client.closed.is_set()
        client.conn.send_data(create, body[10:], end_stream=True)
        client.flush()
        await asyncio.wait_for(client.responses[create].ended.wait(), 30)
        assert client.responses[create].status == 201, bytes(client.responses[create].body)[:300]
        await asyncio.wait_for(client.closed.wait(), 20)  # its last stream done, the connection closes
    finally:
        await client.close()
    assert kubectl(["-n", namespace, "get", "configmap", "in-flight"], check=False).returncode == 0

    again = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        rewatch = again.open("GET", f"{configmaps}?watch=1", auth)
        await asyncio.wait_for(again.responses[rewatch].headers_in.wait(), 30)
        assert again.responses[rewatch].status == 200
        kubectl(["-n", namespace, "create", "configmap", "after-reload"])
        await eventually_async(
            lambda: b'"after-reload"' in bytes(again.responses[rewatch].body),
            30,
            "the new watch's event after the reload",
            0.02,
        )
        refused = await again.request(
            "POST", configmaps, [*auth, ("content-type", "application/json")], _configmap("x")
        )
        assert refused.status == 403 and b"kproxy readonly filter" in bytes(refused.body)  # the new chain
        assert not again.goaway_in.is_set()
    finally:
        await again.close()
    assert kubectl(["-n", namespace, "get", "configmap", "x"], check=False).returncode == 1


async def test_after_a_reload_a_watch_its_client_does_not_read_is_reset_at_the_deadline(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """The wait after a reload's GOAWAY is bounded as a drain's: a watch whose client has let
    its window close cannot end cleanly, and is reset once ``shutdown_timeout`` has passed. The
    connection's other answers are never cut: its request in flight still gets the apiserver's
    answer, and the connection closes after it."""
    rp = _forward(proxy_factory, control_plane, reload_interval="0s", shutdown_timeout="1s")
    auth = [_bearer(control_plane.admin_token)]
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    names = [f"big-{i}" for i in range(3)]  # 90 KB of initial events, past a 64 KiB stream window
    for name in names:
        kubectl(["-n", namespace, "create", "configmap", name, f"--from-literal=v={'x' * 30000}"])
    client = await H2Client.connect(rp.url, str(rp.ca_file), auto_ack=False)
    try:
        client.conn.increment_flow_control_window(1 << 24)  # the connection's window: wide open
        client.flush()
        stuck = client.open("GET", f"{configmaps}?watch=1&resourceVersion=0", auth)
        await eventually_async(
            lambda: len(client.responses[stuck].body) == 65535, 30, "the stuck stream's window to be spent", 0.02
        )
        create = client.open("POST", configmaps, [*auth, ("content-type", "application/json")], end=False)
        client.conn.increment_flow_control_window(1 << 20, create)  # its answer can come
        body = _configmap("in-flight")
        client.conn.send_data(create, body[:10])
        client.flush()
        await eventually_async(
            lambda: "kproxy_requests_in_flight 1.0" in rp.metrics(), 30, "one request in flight", 0.02
        )

        _change_and_reload(rp)
        await asyncio.wait_for(client.goaway_in.wait(), 20)
        assert client.goaway is not None and client.goaway.error_code == 0
        await asyncio.wait_for(client.responses[stuck].ended.wait(), 20)
        assert client.responses[stuck].reset == 2  # INTERNAL_ERROR, once the deadline passed
        assert not client.responses[create].ended.is_set() and not client.closed.is_set()
        client.conn.send_data(create, body[10:], end_stream=True)
        client.flush()
        await asyncio.wait_for(client.responses[create].ended.wait(), 30)
        assert client.responses[create].status == 201, bytes(client.responses[create].body)[:300]
        await asyncio.wait_for(client.closed.wait(), 20)
    finally:
        await client.close()
        kubectl(["-n", namespace, "delete", "configmap", *names, "--ignore-not-found"])
    assert kubectl(["-n", namespace, "get", "configmap", "in-flight"], check=False).returncode == 0
    kubectl(["-n", namespace, "delete", "configmap", "in-flight"])


@pytest.mark.parametrize(
    "filters",
    [[], [{"name": "watchcache", "resources": ["configmaps"]}]],
    ids=["passed-through", "from-the-cache"],
)
def test_a_client_go_informer_follows_its_watch_across_reloads(
    control_plane: ControlPlaneInfo,
    proxy_factory: Callable[..., RunningProxy],
    namespace: str,
    kubectl: Any,
    filters: list[dict[str, Any]],
) -> None:
    """client-go over HTTP/2 through three reloads: each GOAWAY ends its watch cleanly, and its
    reflector watches again from where it was (a new connection), with no error and no relist,
    even when the reload comes right after the watch began (client-go takes a watch that ends
    within a second with no event for an error, and lists again)."""
    rp = _forward(proxy_factory, control_plane, reload_interval="0s", filters=filters)
    inf = Informer(rp.kubeconfig, namespace=namespace, resource="/v1/configmaps")
    try:
        inf.wait(lambda: bool(inf.of("synced")), 60, "the first sync")
        seen = lambda name: any(e["name"] == name for e in inf.of("event"))  # noqa: E731
        for i in range(2):
            kubectl(["-n", namespace, "create", "configmap", f"before-{i}"])
            inf.wait(lambda i=i: seen(f"before-{i}"), 30, f"before-{i}")
            _change_and_reload(rp)
            inf.wait(lambda i=i: len(inf.of("watch")) == i + 2, 30, "the watch to be opened again")
        # Once the new watch has reached kproxy (a connection still in its handshake when the
        # reload comes is served by the new chain already, and is not sent GOAWAY):
        eventually(lambda: _watches(rp) == (2, 1), 10, "kproxy to serve the new watch")
        _change_and_reload(rp)  # the watch just opened has had no event
        inf.wait(lambda: len(inf.of("watch")) == 4, 30, "the new watch to be opened again")
        kubectl(["-n", namespace, "create", "configmap", "after"])
        inf.wait(lambda: seen("after"), 30, "the event made after the reloads")
        watches = inf.of("watch")
    finally:
        inf.stop()
    errors = [line for line in inf.lines if line["kind"] in ("watch-error", "watch-error-event", "watch-open-error")]
    assert not errors, errors
    assert len(inf.of("list")) == 1, inf.of("list")
    assert [w["sendInitialEvents"] for w in watches[1:]] == [False] * 3
    assert all(w["resourceVersion"] not in ("", "0") for w in watches[1:]), watches  # resumed, not listed
    assert b"ended with" not in inf.stderr, inf.stderr[-2000:]  # the reflector saw clean ends
    lines = [json.loads(line) for line in rp.log_text().splitlines() if line.startswith("{")]
    watched = [x for x in lines if x.get("logger") == "kproxy.access" and x.get("verb") == "watch"]
    assert len(watched) >= 2 and {x["protocol"] for x in watched} == {"HTTP/2.0"}
    assert "config reloaded" in rp.log_text()


def _change_and_reload(rp: RunningProxy) -> None:
    """A reload that changes something (the log level, back and forth): one that changes
    nothing sends no client away."""
    level = "debug" if rp.config.get("log", {}).get("level") != "debug" else "info"
    rp.write_config({"log": {**rp.config.get("log", {}), "level": level}})
    rp.proc.send_signal(signal.SIGHUP)


async def test_a_reload_that_changes_nothing_sends_no_goaway(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str, kubectl: Any
) -> None:
    """A SIGHUP with the config as it was (or the same file written again) reloads, and sends no
    HTTP/2 client away: its watch goes on."""
    rp = _forward(proxy_factory, control_plane, reload_interval="0s")
    auth = [_bearer(control_plane.admin_token)]
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        watch = client.open("GET", f"{configmaps}?watch=1", auth)
        await asyncio.wait_for(client.responses[watch].headers_in.wait(), 30)
        rp.write_config({})  # the same settings, written again
        rp.proc.send_signal(signal.SIGHUP)
        eventually(lambda: "config reloaded" in rp.log_text(), 20, "the reload")
        kubectl(["-n", namespace, "create", "configmap", "after-noop-reload"])
        await eventually_async(
            lambda: b'"after-noop-reload"' in bytes(client.responses[watch].body),
            30,
            "the watch's event after the no-op reload",
            0.02,
        )
        assert not client.goaway_in.is_set() and not client.responses[watch].ended.is_set()
    finally:
        await client.close()
    # A reload that does change something still does.
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        watch = client.open("GET", f"{configmaps}?watch=1", auth)
        await asyncio.wait_for(client.responses[watch].headers_in.wait(), 30)
        _change_and_reload(rp)
        await asyncio.wait_for(client.goaway_in.wait(), 20)
    finally:
        await client.close()


def _watches(rp: RunningProxy) -> tuple[float, float]:
    """The watches kproxy has served to their end, and those open."""
    text = rp.metrics()
    ended = re.findall(r'^kproxy_requests_total\{[^}]*verb="watch"[^}]*\} (\S+)$', text, re.M)
    opened = re.search(r"^kproxy_open_watches (\S+)$", text, re.M)
    return sum(float(n) for n in ended), float(opened.group(1)) if opened else 0.0


async def test_an_idle_connection_is_ended_with_goaway(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy]
) -> None:
    rp = _forward(proxy_factory, control_plane, connections={"idle_timeout": "1s"})
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        resp = await client.request("GET", "/version", [_bearer(control_plane.admin_token)])
        assert resp.status == 200
        client.ping()
        await eventually_async(
            lambda: client.pings == 1, 10, "the PING's answer", 0.02
        )  # PING is answered, and is no activity
        await asyncio.wait_for(client.goaway_in.wait(), 10)
        assert client.goaway is not None and client.goaway.error_code == 0
        await asyncio.wait_for(client.closed.wait(), 10)
    finally:
        await client.close()


async def test_a_reset_stream_ends_its_upstream_watch(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    rp = _forward(proxy_factory, control_plane)
    client = await H2Client.connect(rp.url, str(rp.ca_file))
    try:
        sid = client.open("GET", f"/api/v1/namespaces/{namespace}/pods?watch=1", [_bearer(control_plane.admin_token)])
        await asyncio.wait_for(client.responses[sid].headers_in.wait(), 30)
        eventually(lambda: "kproxy_open_watches 1.0" in rp.metrics(), 10, "the watch to be counted")
        client.conn.reset_stream(sid)
        client.flush()
        eventually(lambda: "kproxy_open_watches 0.0" in rp.metrics(), 10, "the watch to end")
        again = await client.request("GET", "/version", [_bearer(control_plane.admin_token)])  # it serves on
        assert again.status == 200
    finally:
        await client.close()


async def test_http2_off_serves_http11(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy]
) -> None:
    rp = _forward(proxy_factory, control_plane, http2={"enabled": False})
    with pytest.raises(AssertionError, match="not h2"):
        await H2Client.connect(rp.url, str(rp.ca_file))
    assert rp.get("/version")[0] == 200


@pytest.mark.parametrize("side", ["apiserver", "kproxy"])
async def test_a_caller_without_credentials_gets_one_request_per_connection(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], side: str
) -> None:
    """The apiserver ends an HTTP/2 connection with GOAWAY after a request of the anonymous user
    (its UnauthenticatedHTTP2DOSMitigation); kproxy in front of it does the same, and keeps the
    connection of a caller with credentials."""
    if side == "kproxy":
        rp = _forward(proxy_factory, control_plane)
        url, ca = rp.url, str(rp.ca_file)
    else:
        url, ca = control_plane.server, None
    client = await H2Client.connect(url, ca)
    try:
        assert (await client.request("GET", "/version", [_bearer(control_plane.user_token)])).status == 200
        assert not client.goaway_in.is_set()
        anonymous = await client.request("GET", "/version")
        assert anonymous.status == 200
        await asyncio.wait_for(client.goaway_in.wait(), 10)
        assert client.goaway is not None and client.goaway.error_code == 0
        await asyncio.wait_for(client.closed.wait(), 10)
    finally:
        await client.close()
