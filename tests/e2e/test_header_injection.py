"""Nothing a caller controls is written into kproxy's upstream request head unchecked, checked at
the real apiserver.

Impersonate mode names the caller in ``Impersonate-*`` headers. A client certificate whose Common
Name or Organization holds a CR or LF (``eve\\r\\nImpersonate-Group: system:masters``), another
control byte, or white space Go's header reader trims (`` system:masters``) would forge another
identity or break the request; kproxy answers such a caller ``401`` and the apiserver never sees
it: nothing is created, and the apiserver's own SelfSubjectReview through kproxy names a valid
caller exactly, odd bytes included. The upgrade path (exec by WebSocket and SPDY) is held the same.

A caller's own header bytes (Go's obs-text, 0x80-0xff, valid UTF-8 or not) reach the apiserver
unchanged on every path (pooled requests, HEAD, upgrades): an ``Impersonate-User`` the apiserver
authorizes by name shows it (a byte dropped on the way would impersonate a different user).
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import ssl
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

SSR = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SSR_BODY = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
WEBSOCKET = [
    ("Connection", b"Upgrade"),
    ("Upgrade", b"websocket"),
    ("Sec-WebSocket-Version", b"13"),
    ("Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Protocol", b"v5.channel.k8s.io"),
]
SPDY = [("Connection", b"Upgrade"), ("Upgrade", b"SPDY/3.1"), ("X-Stream-Protocol-Version", b"v4.channel.k8s.io")]

Headers = Sequence[tuple[str, bytes]]


def call(
    url: str,
    ctx: ssl.SSLContext | None,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Headers = (),
) -> tuple[int, bytes]:
    """(status, body) of one request; header values are sent as the given bytes."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=15)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def caller_ca() -> certs.CertKey:
    return certs.generate_ca("kproxy-header-injection-callers")


@pytest.fixture(scope="module")
def imp(
    control_plane: ControlPlaneInfo, caller_ca: certs.CertKey, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy in impersonate mode, trusting client certificates from ``caller_ca``."""
    tmp = tmp_path_factory.mktemp("kproxy-imp-hdr")
    ca_file = certs.write_pem(tmp / "callers-ca.crt", caller_ca.cert_pem, private=False)
    rp = start_proxy(
        tmp, control_plane.admin_kubeconfig, credentials="impersonate", tls=True,
        extra={"tls": {"client_ca_file": str(ca_file)}},
    )  # fmt: skip
    yield rp
    rp.stop()


def cert_context(rp: RunningProxy, ca: certs.CertKey, tmp: Path, cn: str, orgs: Sequence[str]) -> ssl.SSLContext:
    """A client TLS context presenting a certificate from ``ca`` with this Common Name and these
    Organizations (the user and groups kproxy's x509 authentication gives the caller)."""
    leaf = certs.generate_client_cert(ca, cn, orgs)
    name = secrets.token_hex(4)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    ctx.load_cert_chain(
        certs.write_pem(tmp / f"{name}.crt", leaf.cert_pem, private=False),
        certs.write_pem(tmp / f"{name}.key", leaf.key_pem, private=True),
    )
    return ctx


def who(rp: RunningProxy, ctx: ssl.SSLContext) -> tuple[int, dict[str, object]]:
    code, body = call(rp.url, ctx, "POST", SSR, SSR_BODY)
    return code, json.loads(body)


# (Common Name, Organizations): identities no Impersonate-* header names exactly. Before kproxy
# refused them, the first ones made the caller cluster-admin (system:masters).
HOSTILE = {
    "crlf-in-cn-adds-a-group": ("eve\r\nImpersonate-Group: system:masters", ()),
    "lf-in-cn-adds-a-group": ("eve\nImpersonate-Group: system:masters", ()),
    "crlf-in-o-adds-a-group": ("eve", ("devs\r\nImpersonate-Group: system:masters",)),
    "leading-space-o-is-trimmed-to-masters": ("eve", (" system:masters",)),
    "trailing-tab-o-is-trimmed-to-masters": ("eve", ("system:masters\t",)),
    "cr-in-cn": ("eve\rImpersonate-Group: system:masters", ()),
    "nul-in-cn": ("eve\x00admin", ()),
    "escape-byte-in-cn": ("eve\x1b[0m", ()),
    "del-in-o": ("eve", ("devs\x7f",)),
    "trailing-space-cn": ("eve ", ()),
}


@pytest.mark.parametrize(("cn", "orgs"), HOSTILE.values(), ids=HOSTILE.keys())
def test_certificate_identity_no_header_can_name_is_refused(
    imp: RunningProxy,
    caller_ca: certs.CertKey,
    control_plane: ControlPlaneInfo,
    namespace: str,
    tmp_path: Path,
    cn: str,
    orgs: tuple[str, ...],
) -> None:
    ctx = cert_context(imp, caller_ca, tmp_path, cn, orgs)
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forged"}, "data": {"by": "eve"}}
    code, body = call(imp.url, ctx, "POST", path, json.dumps(doc).encode(), [("Accept", b"application/json")])
    assert code == 401, body[:500]
    status = json.loads(body)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Unauthorized", 401)
    assert str(status["message"]).startswith("Unauthorized: kproxy cannot impersonate this caller: ")
    # At the apiserver: nothing was created, and it has no identity for this caller at all.
    assert control_plane.request("GET", f"{path}/forged")[0] == 404
    assert who(imp, ctx)[0] == 401


@pytest.mark.parametrize(
    ("cn", "orgs"), [("alice", ("devs",)), ("ev\te ü", ("dev ops", "☃"))], ids=["plain", "tab-space-utf8"]
)
def test_certificate_caller_is_named_exactly(
    imp: RunningProxy, caller_ca: certs.CertKey, tmp_path: Path, cn: str, orgs: tuple[str, ...]
) -> None:
    """What a header can carry is carried byte for byte: the apiserver's SelfSubjectReview names
    the caller, inner white space and UTF-8 included, with exactly its groups."""
    code, review = who(imp, cert_context(imp, caller_ca, tmp_path, cn, orgs))
    assert code == 201, review
    info = review["status"]["userInfo"]  # type: ignore[index]
    assert info["username"] == cn
    assert info["groups"] == [*orgs, "system:authenticated"]


@pytest.mark.parametrize("upgrade", [WEBSOCKET, SPDY], ids=["websocket", "spdy"])
def test_upgrade_with_an_identity_no_header_can_name_is_refused(
    imp: RunningProxy, caller_ca: certs.CertKey, namespace: str, tmp_path: Path, upgrade: Headers
) -> None:
    """exec goes upstream on the upgrade path: the same refusal, and a valid caller reaches the
    apiserver as itself (RBAC denies alice; as system:masters it would have been the 404 of the
    missing pod)."""
    path = f"/api/v1/namespaces/{namespace}/pods/nope/exec?command=true&stdout=true"
    forged = cert_context(imp, caller_ca, tmp_path, "eve\r\nImpersonate-Group: system:masters", ())
    code, body = call(imp.url, forged, "GET", path, headers=upgrade)
    assert code == 401, body[:500]
    assert json.loads(body)["reason"] == "Unauthorized"
    alice = cert_context(imp, caller_ca, tmp_path, "alice", ())
    code, body = call(imp.url, alice, "GET", path, headers=upgrade)
    assert code == 403, body[:500]
    assert 'User "alice" cannot' in json.loads(body)["message"]


def test_caller_header_bytes_reach_the_apiserver_unchanged(
    forward_proxy: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str
) -> None:
    """``credentials: forward`` passes the caller's token and ``Impersonate-User`` on (the token is
    an admin's, who may impersonate). A user RBAC lets read pods in this namespace, ``user``, and
    the same name followed by bytes (not UTF-8, or UTF-8): the apiserver must authorize exactly the
    bytes the caller sent -- the longer names are denied directly and through kproxy alike, on the
    pooled path, for HEAD and for an upgrade."""
    user = f"hdr-{secrets.token_hex(4)}"
    kubectl(["create", "role", "reader", "--verb=get,create", "--resource=pods,pods/exec", "-n", namespace])
    kubectl(["create", "rolebinding", "reader", "--role=reader", f"--user={user}", "-n", namespace])
    pod = f"/api/v1/namespaces/{namespace}/pods/nope"
    exec_path = f"{pod}/exec?command=true&stdout=true"
    token = ("Authorization", f"Bearer {control_plane.admin_token}".encode())
    sides = [
        (control_plane.server, control_plane.ssl_context(client_cert=False)),
        (forward_proxy.url, ssl.create_default_context(cafile=str(forward_proxy.ca_file))),
    ]

    def status(side: int, method: str, path: str, name: bytes, more: Headers = ()) -> int:
        url, ctx = sides[side]
        return call(url, ctx, method, path, headers=[token, ("Impersonate-User", name), *more])[0]

    eventually(lambda: status(0, "GET", pod, user.encode()) == 404, 30, "the role binding to apply")
    # Authorized: the missing pod's 404 (405 for HEAD, which the apiserver refuses once authorized).
    for method, path, more, allowed in (
        ("GET", pod, (), 404),
        ("HEAD", pod, (), 405),
        ("GET", exec_path, WEBSOCKET, 404),
    ):
        for side in (0, 1):
            assert status(side, method, path, user.encode(), more) == allowed, (side, method, path)
            for suffix in (b"\xff\x80", b"\xc3\xbc", b"\xc3"):
                got = status(side, method, path, user.encode() + suffix, more)
                assert got == 403, (side, method, path, suffix)

    # The bytes themselves, as the apiserver writes them in protobuf (JSON would write U+FFFD).
    name = user.encode() + b"\xc3\xbc\xff"
    pb = [token, ("Impersonate-User", name), ("Accept", b"application/vnd.kubernetes.protobuf")]
    answers = [call(url, ctx, "POST", SSR, SSR_BODY, pb) for url, ctx in sides]
    assert answers[0][0] == 201, answers[0][1][:300]
    # The two reviews may be stamped in different seconds: compare them without creationTimestamp.
    assert [(code, _untimed(body)) for code, body in answers[1:]] == [(201, _untimed(answers[0][1]))]
    assert name in answers[0][1]


def _untimed(body: bytes) -> bytes:
    """The protobuf body with ObjectMeta.creationTimestamp's seconds masked: field 8, a Time of
    ``seconds`` (field 1, a varint) and ``nanos`` 0."""
    masked, n = re.subn(rb"B\x08\x08[\x80-\xff]{4}[\x00-\x7f]\x10\x00", b"B\x08\x08TIME!\x10\x00", body)
    assert n == 1, body
    return masked
