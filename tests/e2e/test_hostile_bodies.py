"""Hostile bodies at the policy filters, and the namespace rule, against the real apiserver.

Every answer through kproxy is compared with the same bytes sent directly; the verdicts are read
directly from the apiserver (the object is still there, the namespace was or was not created).
A bomb must be refused at once, as the apiserver refuses it, while another caller of the same
kproxy is served and the process does not grow; a caller the apiserver refuses before reading the
body gets the apiserver's refusal, not an answer about a body kproxy decoded for it.
"""

from __future__ import annotations

import http.client
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

YAML = "application/yaml"
JSON = "application/json"


def laughs(levels: int = 9, width: int = 9) -> bytes:
    """Billion laughs: 9**9 scalars from 380 bytes."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join(f"*a{i - 1}" for _ in range(width)) + "]")
    lines.append(f"data: *a{levels}")
    return ("\n".join(lines) + "\n").encode()


def send(
    base: str, method: str, path: str, body: bytes | None = None, ctype: str = JSON,
    token: str | None = None, ctx: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, Any], http.client.HTTPMessage]:  # fmt: skip
    u = urlsplit(base)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, context=ctx, timeout=30)
    else:
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=30)
    headers = {"Accept": JSON, "Content-Type": ctype}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data else {}, resp.headers
    finally:
        conn.close()


class Sides:
    """The same request directly (admin unless a token is given) and through one kproxy."""

    def __init__(self, cp: ControlPlaneInfo, rp: RunningProxy) -> None:
        self.cp, self.rp = cp, rp
        self.direct_base = f"https://127.0.0.1:{cp.apiserver_port}"
        self.proxy_ctx = ssl.create_default_context(cafile=str(rp.ca_file)) if rp.ca_file else None

    def direct(self, method: str, path: str, body: bytes | None = None, ctype: str = JSON, token: str | None = None):  # type: ignore[no-untyped-def]
        # With a token, no client certificate: the apiserver would take the certificate's identity.
        ctx = self.cp.ssl_context(client_cert=token is None)
        return send(self.direct_base, method, path, body, ctype, token or self.cp.admin_token, ctx)

    def anonymous(self, method: str, path: str, body: bytes | None = None, ctype: str = JSON):  # type: ignore[no-untyped-def]
        return send(self.direct_base, method, path, body, ctype, None, self.cp.ssl_context(client_cert=False))

    def via(self, method: str, path: str, body: bytes | None = None, ctype: str = JSON, token: str | None = None):  # type: ignore[no-untyped-def]
        return send(self.rp.url, method, path, body, ctype, token, self.proxy_ctx)

    def exists(self, path: str) -> bool:
        status, _, _ = self.direct("GET", path)
        assert status in (200, 404)
        return status == 200


@pytest.fixture
def ns(control_plane: ControlPlaneInfo) -> Iterator[str]:
    """A namespace holding a ConfigMap ``x`` (made directly), removed afterwards."""
    name = f"dry-hostile-{secrets.token_hex(3)}"
    base = f"https://127.0.0.1:{control_plane.apiserver_port}"
    ctx, token = control_plane.ssl_context(), control_plane.admin_token
    assert send(base, "POST", "/api/v1/namespaces", json.dumps({"metadata": {"name": name}}).encode(),
                token=token, ctx=ctx)[0] == 201  # fmt: skip
    cm = {"metadata": {"name": "x"}, "data": {"k": "v"}}
    assert send(base, "POST", f"/api/v1/namespaces/{name}/configmaps", json.dumps(cm).encode(),
                token=token, ctx=ctx)[0] == 201  # fmt: skip
    yield name
    send(base, "DELETE", f"/api/v1/namespaces/{name}", token=token, ctx=ctx)


ENFORCE = [{"name": "dryrun", "rules": [{"name": "dry", "action": "enforce", "match": {"namespaces": ["dry-*"]}}]}]
REJECT = [{"name": "dryrun", "rules": [{"name": "dry", "action": "reject", "match": {"namespaces": ["dry-*"]}}]}]
STRICT = [{"name": "validation", "rules": [{"name": "strict", "level": "Strict", "match": {"namespaces": ["dry-*"]}}]}]


def _rss(rp: RunningProxy) -> int:
    status = Path(f"/proc/{rp.proc.pid}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


# (content type, body): DELETE bodies the apiserver refuses with its decoder's 400.
DELETE_BOMBS = {
    "alias-bomb": (YAML, laughs()),
    "yaml-depth": (YAML, b"x: " + b"[" * 10001),
    "yaml-depth-100k": (YAML, b"x: " + b"[" * 100_000 + b"]" * 100_000),
    "yaml-20000-levels": (YAML, b"- " * 10000 + b"[" * 10000 + b"]" * 10000),
    "yaml-anchor-in-itself": (YAML, b"a: &x [*x]\n"),
    "yaml-nan": (YAML, b"x: .nan\n"),
    "json-depth": (JSON, b'{"x":' + b"[" * 10001 + b"]" * 10001 + b"}"),
}


@pytest.mark.parametrize("case", list(DELETE_BOMBS), ids=list(DELETE_BOMBS))
def test_delete_bomb_answered_as_the_apiserver_does(
    case: str, control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], ns: str
) -> None:
    """dryrun ``enforce`` must read a DELETE body: a bomb gets the apiserver's own 400 at once,
    kproxy stays responsive and small, and nothing is deleted."""
    sides = Sides(control_plane, proxy_factory(extra={"filters": ENFORCE}))
    ctype, body = DELETE_BOMBS[case]
    path = f"/api/v1/namespaces/{ns}/configmaps/x"
    direct = sides.direct("DELETE", path + "?dryRun=All", body, ctype)
    rss_before = _rss(sides.rp)

    answer: list[Any] = []
    bomb = threading.Thread(target=lambda: answer.append(sides.via("DELETE", path, body, ctype)))
    bomb.start()
    started = time.monotonic()
    other = sides.via("GET", "/version")  # another caller, meanwhile
    waited = time.monotonic() - started
    bomb.join(30)

    assert answer, "no answer to the bomb in 30 s"
    status, got, _ = answer[0]
    assert (status, got) == direct[:2]
    assert other[0] == 200 and waited < 1.0, f"another caller waited {waited:.2f}s"
    assert _rss(sides.rp) - rss_before < 64 << 20
    assert sides.exists(path)


def test_strict_create_with_alias_bomb(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], ns: str
) -> None:
    """validation Strict decodes YAML bodies: a bomb in one is the apiserver's answer, not stored."""
    sides = Sides(control_plane, proxy_factory(extra={"filters": STRICT}))
    body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\nbomb:\n  " + laughs().replace(b"\n", b"\n  ")
    path = f"/api/v1/namespaces/{ns}/configmaps"
    rss_before = _rss(sides.rp)
    started = time.monotonic()
    via = sides.via("POST", path + "?fieldValidation=Strict", body, YAML)
    assert time.monotonic() - started < 2.0
    direct = sides.direct("POST", path + "?fieldValidation=Strict", body, YAML)
    assert via[:2] == direct[:2] and via[0] == 400
    assert _rss(sides.rp) - rss_before < 64 << 20
    assert not sides.exists(f"{path}/bomb")


# Plain scalars go-yaml reads as strings where YAML 1.1 reads numbers (or Python's int() gives up):
# a ConfigMap's data holds only strings, so the apiserver takes each of these.
GO_STRINGS = {"huge": "1" * 400, "digits": "9" * 20000, "hex": "0x_", "base60": "1:20", "overflow": "1e400"}


@pytest.mark.parametrize("filters", [STRICT, ENFORCE], ids=["strict", "dryrun-enforce"])
def test_yaml_scalars_read_as_go_yaml_reads_them(
    filters: list[dict[str, Any]], control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], ns: str
) -> None:
    """A YAML create whose plain scalars go-yaml reads as strings is decoded by kproxy's policy
    filters as the apiserver decodes it: the apiserver's answer, and the same data persisted."""
    sides = Sides(control_plane, proxy_factory(extra={"filters": filters}))
    path = f"/api/v1/namespaces/{ns}/configmaps"
    data = "".join(f"  {k}: {v}\n" for k, v in GO_STRINGS.items())

    def body(name: str) -> bytes:
        return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n{data}".encode()

    direct = sides.direct("POST", path + "?fieldValidation=Strict", body("direct"), YAML)
    assert direct[0] == 201, direct[1]
    query = "?fieldValidation=Strict" if filters is STRICT else "?dryRun=All"
    via = sides.via("POST", path + query, body("via"), YAML)
    assert via[0] == 201, via[1]
    assert via[1]["data"] == direct[1]["data"] == GO_STRINGS
    if filters is STRICT:
        status, stored, _ = sides.direct("GET", f"{path}/via")
        assert status == 200 and stored["data"] == GO_STRINGS


@pytest.fixture
def forward(proxy_factory: Callable[..., RunningProxy]) -> Callable[[list[dict[str, Any]]], RunningProxy]:
    return lambda filters: proxy_factory(credentials="forward", tls=True, extra={"filters": filters})


@pytest.mark.parametrize("who", ["anonymous", "user"])
def test_refused_caller_gets_the_apiservers_refusal_before_any_decoding(
    who: str, control_plane: ControlPlaneInfo, forward: Callable[..., RunningProxy], ns: str
) -> None:
    """Authentication and authorization come before the body at the apiserver: a caller it refuses
    gets its 403 from kproxy too, never a 400 about a body kproxy decoded for it."""
    sides = Sides(control_plane, forward(ENFORCE))
    token = None if who == "anonymous" else control_plane.user_token
    path = f"/api/v1/namespaces/{ns}/configmaps/x"
    for ctype, body in (DELETE_BOMBS["alias-bomb"], DELETE_BOMBS["yaml-depth"], (JSON, b"{bad")):
        via = sides.via("DELETE", path, body, ctype, token=token)
        direct = (
            sides.anonymous("DELETE", path, body, ctype)
            if token is None
            else sides.direct("DELETE", path, body, ctype, token=token)
        )
        assert via[:2] == direct[:2] and via[0] == 403, body[:40]
    assert sides.exists(path)


def test_refused_caller_gets_the_apiservers_refusal_not_the_rules(
    control_plane: ControlPlaneInfo, forward: Callable[..., RunningProxy], ns: str
) -> None:
    """A reject rule's 403 and an invalid dryRun's 422 are kproxy's answers: a caller the apiserver
    refuses anyway gets the apiserver's refusal instead."""
    token = control_plane.user_token
    path = f"/api/v1/namespaces/{ns}/configmaps/x"
    sides = Sides(control_plane, forward(REJECT))
    assert sides.via("DELETE", path, token=token)[:2] == sides.direct("DELETE", path, token=token)[:2]
    sides = Sides(control_plane, forward(ENFORCE))
    via = sides.via("DELETE", path + "?dryRun=Nope", token=token)
    assert via[:2] == sides.direct("DELETE", path + "?dryRun=Nope", token=token)[:2] and via[0] == 403
    assert sides.exists(path)


def test_strict_check_is_not_done_for_a_refused_caller(
    control_plane: ControlPlaneInfo, forward: Callable[..., RunningProxy], ns: str
) -> None:
    """The validation filter decodes nothing for a caller the apiserver refuses (its check-time
    histogram does not move) and the caller gets the apiserver's 403."""
    sides = Sides(control_plane, forward(STRICT))
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}, "bogus": 1}).encode()
    path = f"/api/v1/namespaces/{ns}/configmaps?fieldValidation=Strict"

    def checks() -> float:
        for line in sides.rp.metrics().splitlines():
            if line.startswith("kproxy_validation_check_seconds_count"):
                return float(line.split()[-1])
        return 0.0

    before = checks()
    via = sides.via("POST", path, body, token=control_plane.user_token)
    assert via[:2] == sides.direct("POST", path, body, token=control_plane.user_token)[:2] and via[0] == 403
    assert checks() == before
    via = sides.via("POST", path, body, token=control_plane.admin_token)  # allowed: checked locally
    assert via[0] == 400 and checks() == before + 1


# --------------------------------------------------------------------------- the namespace rule


def _ns_body(name: str | None = None, generate: str | None = None, ctype: str = JSON) -> bytes:
    meta = {"name": name} if name else {"generateName": generate}
    if ctype == YAML:
        ((key, value),) = meta.items()
        return f"apiVersion: v1\nkind: Namespace\nmetadata:\n  {key}: {value}\n".encode()
    return json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}).encode()


@pytest.mark.parametrize("ctype", [JSON, YAML])
def test_namespace_rule_covers_the_namespace_itself(
    ctype: str, control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """A rule for ``dry-*`` makes creating the Namespace ``dry-x`` a dry run (it was created for
    real), as updating and deleting it already were; other names are untouched."""
    sides = Sides(control_plane, proxy_factory(extra={"filters": ENFORCE}))
    dry, wet = f"dry-{secrets.token_hex(3)}", f"wet-{secrets.token_hex(3)}"
    try:
        status, obj, headers = sides.via("POST", "/api/v1/namespaces", _ns_body(dry, ctype=ctype), ctype)
        assert status == 201 and obj["metadata"]["name"] == dry and "kproxy dryrun rule" in headers["Warning"]
        assert not sides.exists(f"/api/v1/namespaces/{dry}")

        status, obj, _ = sides.via("POST", "/api/v1/namespaces", _ns_body(generate="dry-", ctype=ctype), ctype)
        assert status == 201 and obj["metadata"]["name"].startswith("dry-")
        assert not sides.exists(f"/api/v1/namespaces/{obj['metadata']['name']}")

        assert sides.via("POST", "/api/v1/namespaces", _ns_body(wet, ctype=ctype), ctype)[0] == 201
        assert sides.exists(f"/api/v1/namespaces/{wet}")

        # Made directly, then deleted through kproxy: a dry run, it stays Active.
        assert sides.direct("POST", "/api/v1/namespaces", _ns_body(dry))[0] == 201
        assert sides.via("DELETE", f"/api/v1/namespaces/{dry}")[0] == 200
        assert sides.direct("GET", f"/api/v1/namespaces/{dry}")[1]["status"]["phase"] == "Active"
    finally:
        for name in (dry, wet):
            sides.direct("DELETE", f"/api/v1/namespaces/{name}")


def test_namespace_rule_in_validation(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """A Strict rule for ``dry-*`` applies to creating the Namespace ``dry-x`` (the apiserver's own
    Strict 400 for an unknown field), not to ``wet-x`` (created, with the apiserver's warning)."""
    sides = Sides(control_plane, proxy_factory(extra={"filters": STRICT}))
    dry, wet = f"dry-{secrets.token_hex(3)}", f"wet-{secrets.token_hex(3)}"

    def body(name: str) -> bytes:
        return json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "bogus": 1}).encode()

    try:
        via = sides.via("POST", "/api/v1/namespaces", body(dry))
        direct = sides.direct("POST", "/api/v1/namespaces?fieldValidation=Strict", body(dry))
        assert via[:2] == direct[:2] and via[0] == 400
        assert not sides.exists(f"/api/v1/namespaces/{dry}")
        assert sides.via("POST", "/api/v1/namespaces", body(wet))[0] == 201
        assert sides.exists(f"/api/v1/namespaces/{wet}")
    finally:
        for name in (dry, wet):
            sides.direct("DELETE", f"/api/v1/namespaces/{name}")
