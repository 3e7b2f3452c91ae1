"""The WebSocket bearer protocol (`Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.<token>`)
identifies a caller only where the apiserver's own authenticator accepts it: on a WebSocket request,
next to another protocol, one token, valid unpadded base64url. On any other request the header means
nothing (the caller is anonymous), and a malformed one on a WebSocket request is a 401.

Each answer through kproxy is compared with the same request sent straight to the apiserver with the
same credentials: cached reads in `credentials: forward` (kproxy decides who the caller is before
the cache answers) and every request in `credentials: impersonate` (kproxy decides who the apiserver
is told the caller is)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

import aiohttp

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

_PREFIX = "base64url.bearer.authorization.k8s.io."


def _protocol(token: str) -> str:
    return _PREFIX + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _get(url: str, ctx: ssl.SSLContext, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _reader(control_plane: ControlPlaneInfo, namespace: str) -> str:
    """A TokenRequest token of a ServiceAccount that may get, list and watch ConfigMaps in ``namespace``."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    objects = [
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}}),
        (
            f"{rbac}/roles",
            {
                "metadata": {"name": "reader"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
            },
        ),
        (
            f"{rbac}/rolebindings",
            {
                "metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        ),
        (f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "cm"}, "data": {"k": "v"}}),
    ]
    for path, obj in objects:
        assert control_plane.request("POST", path, body=json.dumps(obj).encode())[0] == 201, path
    status, body = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/reader/token",
        body=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}).encode(),
    )
    assert status == 201, body
    token: str = json.loads(body)["status"]["token"]
    eventually(
        lambda: control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps", token=token)[0] == 200,
        20,
        "the reader's binding to apply",
    )
    return token


def test_forward_cache_ignores_the_protocol_token_on_plain_requests(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """A plain GET carrying the token only as a WebSocket protocol is anonymous at the apiserver: the
    cache must refuse it with the apiserver's 403, not serve the token's owner."""
    token = _reader(control_plane, namespace)
    rp = proxy_factory(
        credentials="forward",
        tls=True,
        extra={"filters": [{"name": "watchcache", "resources": ["configmaps"]}]},
    )
    via = ssl.create_default_context(cafile=str(rp.ca_file))
    direct = control_plane.ssl_context(client_cert=False)
    lst = f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0"

    def from_cache() -> bool:
        # The token's owner is served from the cache (its first reads may still go to the
        # apiserver while the cache fills and its access is first reviewed).
        return _get(rp.url + lst, via, {"Authorization": f"Bearer {token}"})[0] == 200 and 'served="cache"' in (
            rp.metrics()
        )

    eventually(from_cache, 30, "the token's owner served from the cache")

    for path in (lst, f"/api/v1/namespaces/{namespace}/configmaps/cm?resourceVersion=0"):
        for protocols in (_protocol(token), f"{_protocol(token)}, v4.channel.k8s.io"):
            headers = {"Sec-WebSocket-Protocol": protocols}
            want = _get(control_plane.server + path, direct, headers)
            assert want[0] == 403 and b"system:anonymous" in want[1], want
            assert _get(rp.url + path, via, headers) == want, (path, protocols)


async def _ws_watch(url: str, ctx: ssl.SSLContext, protocols: tuple[str, ...], headers: dict[str, str]) -> object:
    """A WebSocket watch: ("open", events) or the handshake's refusal status."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(
                url, protocols=protocols, ssl=ctx, origin="http://localhost", headers=headers
            ) as ws:
                events = [json.loads(msg.data)["object"]["metadata"]["name"] async for msg in ws]
                return ("open", events)
        except aiohttp.WSServerHandshakeError as err:
            return err.status


def test_impersonate_mode_ignores_the_protocol_token_on_plain_requests(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """Not a WebSocket request: the protocol header names no one, so kproxy must not impersonate
    the token's owner (a GET the apiserver refuses the anonymous caller)."""
    token = _reader(control_plane, namespace)
    rp = proxy_factory(credentials="impersonate", tls=True)
    via = ssl.create_default_context(cafile=str(rp.ca_file))
    direct = control_plane.ssl_context(client_cert=False)
    get = f"/api/v1/namespaces/{namespace}/configmaps/cm"
    headers = {"Sec-WebSocket-Protocol": f"{_protocol(token)}, v4.channel.k8s.io"}
    want = _get(control_plane.server + get, direct, headers)
    assert want[0] == 403 and b"system:anonymous" in want[1], want
    assert _get(rp.url + get, via, headers) == want


async def test_impersonate_mode_websocket_watches_authenticate_as_the_apiserver_does(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    """The token works next to another protocol (and, as the apiserver removes it once it has
    authenticated by it, the upstream's handshake must not see it); malformed forms are refused
    as the apiserver refuses them."""
    token = _reader(control_plane, namespace)
    rp = proxy_factory(credentials="impersonate", tls=True)
    via = ssl.create_default_context(cafile=str(rp.ca_file))
    direct = control_plane.ssl_context(client_cert=False)
    watch = f"/api/v1/namespaces/{namespace}/configmaps?watch=1&timeoutSeconds=1"
    cases: list[tuple[tuple[str, ...], dict[str, str]]] = [
        ((_protocol(token), "v4.channel.k8s.io"), {}),
        ((_protocol(token), "v4.channel.k8s.io"), {"Authorization": "Bearer not-a-token"}),
        ((_protocol(token),), {}),  # no other protocol
        ((_protocol(token), _protocol(token), "v4.channel.k8s.io"), {}),  # two tokens
        ((_protocol(token) + "=", "v4.channel.k8s.io"), {}),  # padded
        ((_PREFIX + "a$b", "v4.channel.k8s.io"), {}),  # not base64url
        ((_protocol("not-a-token"), "v4.channel.k8s.io"), {}),
        ((_PREFIX, "v4.channel.k8s.io"), {}),  # empty token: anonymous
    ]
    server = control_plane.server.replace("https://", "wss://")
    for protocols, extra in cases:
        want_ws = await _ws_watch(server + watch, direct, protocols, extra)
        got_ws = await _ws_watch(rp.url.replace("https://", "wss://") + watch, via, protocols, extra)
        assert got_ws == want_ws, (protocols, extra)
    assert await _ws_watch(server + watch, direct, cases[0][0], {}) == ("open", ["cm"])
