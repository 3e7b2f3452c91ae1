"""An Upgrade header does not switch a policy off. The apiserver upgrades only its connect
subresources (pods exec/attach/portforward/proxy, services and nodes proxy: handlers/rest.go
ConnectResource and the UpgradeAwareHandler) and WebSocket watches (handlers/watch.go); any other
request carrying ``Connection: Upgrade`` and an ``Upgrade`` header is an ordinary request to it
(Go's net/http hands it to the handler as any other). So writes with one, through kproxy in
``forward`` and ``impersonate`` modes, under a Strict rule and a dryrun ``enforce`` rule, must
persist nothing (checked by a direct GET as admin), and answer as the apiserver answers the same
request at Strict (``fieldValidation=Strict``) or as a dry run (``dryRun=All``)."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from . import bodies as b
from .conftest import POLICY_FILTERS, Twins, start_capped
from .wire import Answer, Endpoint, exchange, request_bytes

WRITER = "adv-upgrade-writer"
MODES = ("forward", "impersonate")
POLICIES = ("strict", "enforce")

#: (id, Connection, Upgrade): how a caller may ask for an upgrade.
UPGRADES = [
    ("websocket", "Upgrade", "websocket"),
    ("h2c", "Upgrade, HTTP2-Settings", "h2c"),
    ("x", "Upgrade", "x"),
    ("spdy", "Upgrade", "SPDY/3.1"),
    ("keepalive-websocket-upper", "keep-alive, UPGRADE", "WebSocket"),
]


@dataclass(frozen=True)
class Write:
    id: str
    kind: str  # create | modify
    method: str
    target: str  # {ns}, {name}, {seed}
    ctype: str
    body: bytes | None  # {name} substituted


_BOGUS_CM = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{name}"},"data":{"k":"v"},"bogusField":1}'
_BOGUS_SEED = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{seed}"},"data":{"k":"x"},"bogusField":1}'
COLL = "/api/v1/namespaces/{ns}/configmaps"
SEED = COLL + "/{seed}"
WRITES = [
    Write("post", "create", "POST", COLL, b.JSON, _BOGUS_CM),
    Write("post-yaml", "create", "POST", COLL, b.YAML,
          b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  k: v\nbogusField: x\n"),
    Write("put", "modify", "PUT", SEED, b.JSON, _BOGUS_SEED),
    Write("merge-patch", "modify", "PATCH", SEED, b.MERGE, b'{"data":{"k":"changed"},"bogusField":"x"}'),
    Write("strategic-patch", "modify", "PATCH", SEED, b.STRATEGIC, b'{"data":{"k":"changed"},"bogusField":"x"}'),
    Write("json-patch", "modify", "PATCH", SEED, b.JSON_PATCH,
          b'[{"op":"add","path":"/data/k","value":"changed"},{"op":"add","path":"/bogusField","value":"x"}]'),
    Write("apply-yaml", "modify", "PATCH", SEED + "?fieldManager=adv&force=true", b.APPLY_YAML,
          b"apiVersion: v1\nkind: ConfigMap\ndata:\n  k: changed\nbogusField: x\n"),
    Write("apply-yaml-create", "create", "PATCH", COLL + "/{name}?fieldManager=adv", b.APPLY_YAML,
          b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  k: v\nbogusField: x\n"),
]  # fmt: skip


@pytest.fixture(scope="module")
def caller_ca() -> certs.CertKey:
    return certs.generate_ca("adv-upgrade-callers-ca")


@pytest.fixture(scope="module")
def writer_rbac(control_plane: ControlPlaneInfo, twins: Twins) -> None:
    """The impersonate-mode caller may write configmaps in kproxy's twin namespace."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{twins.via}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": WRITER},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": WRITER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": WRITER},
               "subjects": [{"kind": "User", "name": WRITER, "apiGroup": "rbac.authorization.k8s.io"}]}  # fmt: skip
    for path, obj in ((f"{rbac}/roles", role), (f"{rbac}/rolebindings", binding)):
        code, resp = control_plane.request("POST", path, body=json.dumps(obj).encode())
        assert code in (201, 409), resp


@dataclass
class Caller:
    """A kproxy and how the caller reaches it (endpoint, headers carrying its credentials)."""

    proxy: RunningProxy
    endpoint: Endpoint
    headers: list[tuple[str, str]]


@pytest.fixture(scope="module")
def callers(
    control_plane: ControlPlaneInfo,
    tmp_path_factory: pytest.TempPathFactory,
    caller_ca: certs.CertKey,
    writer_rbac: None,
) -> Iterator[Callable[[str, str], Caller]]:
    """``get(mode, policy)``: a kproxy in ``mode`` with ``policy``'s filter, started on first use."""
    started: dict[tuple[str, str], Caller] = {}

    def get(mode: str, policy: str) -> Caller:
        if (mode, policy) in started:
            return started[(mode, policy)]
        tmp = tmp_path_factory.mktemp(f"adv-up-{mode}-{policy}")
        filters = {"filters": POLICY_FILTERS[policy]}
        if mode == "forward":
            rp = start_capped(tmp / "p", control_plane, credentials="forward", tls=True, extra=filters)
            ctx = ssl.create_default_context(cafile=str(rp.ca_file))
            token = [("Authorization", f"Bearer {control_plane.admin_token}")]
            caller = Caller(rp, Endpoint.from_url(rp.url, ctx), token)
        else:
            ca_file = certs.write_pem(tmp / "callers-ca.crt", caller_ca.cert_pem, private=False)
            rp = start_capped(tmp / "p", control_plane, credentials="impersonate", tls=True,
                              extra={**filters, "tls": {"client_ca_file": str(ca_file)}})  # fmt: skip
            leaf = certs.generate_client_cert(caller_ca, WRITER, ("adv-upgrade",))
            crt = certs.write_pem(tmp / "c.crt", leaf.cert_pem, private=False)
            key = certs.write_pem(tmp / "c.key", leaf.key_pem, private=True)
            ctx = ssl.create_default_context(cafile=str(rp.ca_file))
            ctx.load_cert_chain(str(crt), str(key))
            caller = Caller(rp, Endpoint.from_url(rp.url, ctx), [])
        started[(mode, policy)] = caller
        return caller

    yield get
    for c in started.values():
        c.proxy.stop()


def _with(target: str, param: str) -> str:
    return target + ("&" if "?" in target else "?") + param


def _raw(w: Write, ns: str, name: str, seed: str, upgrade: tuple[str, str, str], extra: list[tuple[str, str]],
         param: str | None = None) -> bytes:  # fmt: skip
    target = w.target.format(ns=ns, name=name, seed=seed)
    if param:
        target = _with(target, param)
    body = (w.body or b"").replace(b"{name}", name.encode()).replace(b"{seed}", seed.encode())
    headers = [("Accept", "application/json"), ("Content-Type", w.ctype), *extra,
               ("Connection", upgrade[1]), ("Upgrade", upgrade[2])]  # fmt: skip
    return request_bytes(w.method, target, headers, body)


def _persisted(twins: Twins, w: Write, name: str, seed: str, seed_rv: str) -> str | None:
    if w.kind == "create":
        obj = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/{name}")
        return None if obj is None else f"{name} was created: {json.dumps(obj)[:300]}"
    obj = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/{seed}")
    if obj is None or obj["metadata"]["resourceVersion"] != seed_rv:
        return f"{seed} was changed or deleted: {json.dumps(obj)[:300]}"
    return None


@pytest.mark.parametrize("upgrade", [pytest.param(u, id=u[0]) for u in UPGRADES])
@pytest.mark.parametrize("write", [pytest.param(w, id=w.id) for w in WRITES])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", MODES)
def test_an_upgrade_header_keeps_the_policy(
    mode: str,
    policy: str,
    write: Write,
    upgrade: tuple[str, str, str],
    callers: Callable[[str, str], Caller],
    twins: Twins,
    control_plane: ControlPlaneInfo,
) -> None:
    caller = callers(mode, policy)
    tag = f"{mode[:3]}-{policy[:3]}-{write.id}-{upgrade[0]}"[:60].rstrip("-")
    name, seed = f"up-{tag}", f"upseed-{tag}"
    seed_rv = ""
    if write.kind == "modify":
        twins.seed(seed)
        obj = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/{seed}")
        assert obj is not None
        seed_rv = obj["metadata"]["resourceVersion"]
    raw = _raw(write, twins.via, name, seed, upgrade, caller.headers)
    via: Answer = exchange(caller.endpoint, raw)
    persisted = _persisted(twins, write, name, seed, seed_rv)
    assert persisted is None, f"{persisted}; kproxy answered {via.short()}; raw={raw[:1500]!r}"
    # The apiserver's own answer to the same request at the level the policy asks for.
    param = "fieldValidation=Strict" if policy == "strict" else "dryRun=All"
    direct = exchange(twins.direct_endpoint, _raw(write, twins.direct, name, seed, upgrade, [], param))
    detail = f"kproxy: {via.short()}; apiserver: {direct.short()}; raw={raw[:1500]!r}"
    assert via.status == direct.status, detail
    assert via.is_status() == direct.is_status(), detail
    if policy == "strict":
        assert via.status >= 400 and b"bogusField" in via.body, detail
        # the apiserver's Strict error itself (kproxy's local answer is byte for byte the same;
        # a patch's error quotes the patched object, whose uid and times differ between the twins)
        if write.method != "PATCH":
            assert via.body.replace(twins.via.encode(), twins.direct.encode()) == direct.body, detail
        else:
            assert (via.json() or {}).get("reason") == (direct.json() or {}).get("reason"), detail
    assert "Traceback" not in caller.proxy.log_text()


def _read_until(ep: Endpoint, raw: bytes, needle: bytes, timeout: float) -> bytes:
    """Send ``raw`` and read until ``needle`` arrives, the connection ends, or ``timeout``."""
    sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
    if ep.tls is not None:
        sock = ep.tls.wrap_socket(sock, server_hostname=ep.host)
    got = b""
    deadline = time.monotonic() + timeout
    try:
        sock.sendall(raw)
        while needle not in got and time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            got += data
    finally:
        sock.close()
    return got


@pytest.mark.parametrize("mode", MODES)
def test_a_watch_with_an_upgrade_header_streams(mode: str, callers: Callable[[str, str], Caller], twins: Twins) -> None:
    """The apiserver serves a watch with a non-WebSocket Upgrade header as an ordinary watch: its
    events reach the caller as they come, not when the watch ends (kproxy holds no such answer)."""
    caller = callers(mode, "strict")
    twins.seed(f"upwatch-{mode}")
    target = f"/api/v1/namespaces/{twins.via}/configmaps?watch=1&timeoutSeconds=120"
    headers = [("Accept", "application/json"), *caller.headers, ("Connection", "Upgrade"), ("Upgrade", "h2c")]
    got = _read_until(caller.endpoint, request_bytes("GET", target, headers), f"upwatch-{mode}".encode(), 15)
    assert got.startswith(b"HTTP/1.1 200 ") and b'"type":"ADDED"' in got, got[:500]


@pytest.mark.parametrize("mode", MODES)
def test_head_with_an_upgrade_header_is_answered(
    mode: str, callers: Callable[[str, str], Caller], twins: Twins
) -> None:
    """A HEAD's answer has no body, whatever its Content-Length says: kproxy waits for none."""
    caller = callers(mode, "strict")
    target = f"/api/v1/namespaces/{twins.via}/configmaps"
    headers = [("Accept", "application/json"), ("Connection", "Upgrade"), ("Upgrade", "websocket")]
    via = exchange(caller.endpoint, request_bytes("HEAD", target, [*headers, *caller.headers]), timeout=15)
    direct = exchange(twins.direct_endpoint, request_bytes("HEAD", target.replace(twins.via, twins.direct), headers))
    # go-restful routes no HEAD (405 here); what matters is that an answer comes, without a body
    assert via.status == direct.status and via.status > 0, (via.short(), direct.short())
    assert via.body == b"" and via.header("Content-Length") == direct.header("Content-Length")


@pytest.mark.parametrize("mode", MODES)
def test_bytes_after_a_declined_upgrade_are_a_request_the_filters_see(
    mode: str, callers: Callable[[str, str], Caller], twins: Twins
) -> None:
    """A Strict-refused write with an Upgrade header, then a second write on the same connection:
    the second is read as a request of its own and judged too (nothing spliced, nothing persisted)."""
    caller = callers(mode, "strict")
    first, second = f"uppipe-1-{mode}", f"uppipe-2-{mode}"
    coll = f"/api/v1/namespaces/{twins.via}/configmaps"
    base = [("Accept", "application/json"), ("Content-Type", b.JSON), *caller.headers]
    raw = request_bytes("POST", coll, [*base, ("Connection", "Upgrade"), ("Upgrade", "websocket")],
                        b.cm_json(first, bogusField="x"))  # fmt: skip
    raw += request_bytes("POST", coll, [*base, ("Connection", "close")], b.cm_json(second, bogusField="x"))
    got = _read_until(caller.endpoint, raw, b"\r\n\r\nNEVER", 15)
    for name in (first, second):
        assert twins.get(f"{coll}/{name}") is None, f"{name} was persisted; kproxy answered {got[:800]!r}"
    assert not got.startswith(b"HTTP/1.1 101"), got[:300]


@pytest.mark.parametrize("upgrade", [None, ("Upgrade", "x"), ("Upgrade", "websocket")], ids=["none", "x", "websocket"])
def test_an_upgrade_header_does_not_lift_the_body_deadline(
    upgrade: tuple[str, str] | None,
    capped_factory: Callable[..., RunningProxy],
    twins: Twins,
    control_plane: ControlPlaneInfo,
) -> None:
    """A write whose body stalls gets the apiserver's 504 at the body read deadline, Upgrade
    header or not: the apiserver's request timeout spares only its long-running requests
    (staging/src/k8s.io/apiserver/pkg/server/filters/longrunning.go), never a write because of a
    header; an exempt stalled body would be held, and its connection kept, for ever."""
    rp = capped_factory(extra={"filters": POLICY_FILTERS["strict"], "bodies": {"read_timeout": "2s"}})
    coll = f"/api/v1/namespaces/{twins.via}/configmaps"
    headers = [("Accept", "application/json"), ("Content-Type", b.JSON), ("Content-Length", "100000")]
    if upgrade is not None:
        headers += [("Connection", upgrade[0]), upgrade]
    raw = request_bytes("POST", coll, headers, b'{"apiVersion":"v1","kind":"ConfigMap",')
    got = _read_until(Endpoint.from_url(rp.url), raw, b"\r\n\r\n", 12)
    assert got.startswith(b"HTTP/1.1 504 "), got[:300] or "no answer in 12 s"


def test_the_watch_cache_leaves_only_websocket_watches_to_the_apiserver(
    capped_factory: Callable[..., RunningProxy], twins: Twins
) -> None:
    """A watch with a non-WebSocket Upgrade header is an ordinary watch to the apiserver, and the
    cache serves it as one; a WebSocket watch gets the apiserver's own 101."""
    rp = capped_factory(extra={"filters": [{"name": "watchcache", "resources": ["configmaps"]}]})
    coll = f"/api/v1/namespaces/{twins.via}/configmaps"
    rp.wait_cached(coll, "configmaps")
    twins.seed("upcache-seen")
    ep = Endpoint.from_url(rp.url)
    target = f"{coll}?watch=1&timeoutSeconds=60"
    h2c = [("Accept", "application/json"), ("Connection", "Upgrade"), ("Upgrade", "h2c")]
    got = _read_until(ep, request_bytes("GET", target, h2c), b"upcache-seen", 15)
    assert got.startswith(b"HTTP/1.1 200 ") and b'"type":"ADDED"' in got, got[:300]
    assert 'resource="configmaps",served="cache",verb="watch"' in rp.metrics()
    ws = [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"),
          ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Origin", "http://localhost")]  # fmt: skip
    got = _read_until(ep, request_bytes("GET", target, ws), b"\r\n\r\n", 15)
    assert got.startswith(b"HTTP/1.1 101 "), got[:300]
    assert 'reason="websocket",resource="configmaps",served="upstream",verb="watch"' in rp.metrics()
