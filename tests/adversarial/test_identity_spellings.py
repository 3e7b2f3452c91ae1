"""`credentials: forward`: kproxy's policy sees exactly the caller the apiserver sees, however the
caller spells its credentials.

The apiserver finds a bearer token with Go's string functions (bearertoken.go: strings.TrimSpace,
which trims all of Unicode's white space; websocket/protocol.go behind wsstream.IsWebSocketRequest:
strings.EqualFold, which folds U+017F to s and U+212A to k, and httpstream.IsUpgradeRequest: a
Connection value containing "upgrade"). A spelling kproxy read differently was a caller that
kproxy's rules by user took for anonymous while the apiserver acted as the service account.

For each spelling, at the apiserver: a SelfSubjectReview sent straight to it names the service
account (so the spelling does authenticate there), the same review through kproxy names it too,
a write through a kproxy whose `dryrun` rule enforces dry runs for the namespace's service
accounts is not persisted, and a write with an unknown field through a kproxy whose Strict
validation rule selects them is refused and not persisted."""

from __future__ import annotations

import base64
import json
import secrets
import signal
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .accounts import account_with_role, create
from .conftest import start_capped
from .wire import Answer, Endpoint, exchange

SSR = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
PREFIX = "base64url.bearer.authorization.k8s.io."
WS = [("Upgrade", "websocket"), ("Connection", "Upgrade")]


def protocol(token: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


#: id -> the header lines carrying ``token`` in that spelling.
SPELLINGS: dict[str, Callable[[str], list[tuple[str, str]]]] = {
    # bearertoken.go: strings.TrimSpace before the scheme, on every white space Unicode has.
    "auth-lead-em-space": lambda t: [("Authorization", f"\u2003Bearer {t}")],
    "auth-lead-ideographic-space": lambda t: [("Authorization", f"\u3000Bearer {t}")],
    "auth-lead-line-separator": lambda t: [("Authorization", f"\u2028Bearer {t}")],
    "auth-lead-ogham-space": lambda t: [("Authorization", f"\u1680Bearer {t}")],
    "auth-lead-medium-math-space": lambda t: [("Authorization", f"\u205fBearer {t}")],
    # Latin-1 white space was always trimmed; trailing white space reaches the token, which the
    # apiserver's JWT parser strips again (go-jose): both keep kproxy's reading honest.
    "auth-lead-next-line": lambda t: [("Authorization", f"\x85Bearer {t}")],
    "auth-trail-ideographic-space": lambda t: [("Authorization", f"Bearer {t}\u3000")],
    "auth-trail-paragraph-separator": lambda t: [("Authorization", f"bEaReR {t}\u2029")],
    "auth-first-of-two": lambda t: [("Authorization", f"\u2000Bearer {t}"), ("Authorization", "Bearer x")],
    # wsstream.IsWebSocketRequest: strings.EqualFold(Upgrade, "websocket").
    "ws-upgrade-long-s": lambda t: [
        ("Upgrade", "web\u017focket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Protocol", f"x, {protocol(t)}")
    ],
    "ws-upgrade-kelvin": lambda t: [
        ("Upgrade", "WEBSOC\u212aET"), ("Connection", "Upgrade"), ("Sec-WebSocket-Protocol", f"{protocol(t)},x")
    ],
    # httpstream.IsUpgradeRequest: a Connection value containing "upgrade", anywhere.
    "ws-connection-ideographic": lambda t: [
        ("Upgrade", "websocket"), ("Connection", "\u3000Upgrade"), ("Sec-WebSocket-Protocol", f"x,{protocol(t)}")
    ],
    "ws-connection-substring": lambda t: [
        ("Upgrade", "websocket"), ("Connection", "keep-alive upgraded"), ("Sec-WebSocket-Protocol", f"x,{protocol(t)}")
    ],
    # protocol.go: strings.TrimSpace on each comma-separated protocol.
    "ws-protocol-ideographic": lambda t: [*WS, ("Sec-WebSocket-Protocol", f"x,\u3000{protocol(t)}")],
    "ws-protocol-em-space-after": lambda t: [*WS, ("Sec-WebSocket-Protocol", f"{protocol(t)}\u2003,x")],
    "ws-protocol-two-lines": lambda t: [
        *WS, ("Sec-WebSocket-Protocol", "x"), ("Sec-WebSocket-Protocol", f"\u205f{protocol(t)}")
    ],
}  # fmt: skip


@dataclass
class Setup:
    cp: ControlPlaneInfo
    ns: str
    token: str
    enforce: RunningProxy
    strict: RunningProxy
    #: Strict validated by kproxy alone (``upstream_validates: "no"``, as for an apiserver before 1.25).
    strict_own: RunningProxy

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.ns}:bot"


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    cp = control_plane
    ns = f"adv-spell-{secrets.token_hex(3)}"
    create(cp, "/api/v1/namespaces", {"metadata": {"name": ns}})
    token = account_with_role(cp, ns, "bot", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}])
    match = {"users": [f"system:serviceaccount:{ns}:*"]}
    enforce = start_capped(tmp_path_factory.mktemp("spell-enforce"), cp, credentials="forward", tls=True, extra={
        "filters": [{"name": "dryrun", "rules": [{"name": "sa", "match": match, "action": "enforce"}]}],
    })  # fmt: skip
    strict = start_capped(tmp_path_factory.mktemp("spell-strict"), cp, credentials="forward", tls=True, extra={
        "filters": [{"name": "validation", "rules": [{"name": "sa", "match": match, "level": "Strict"}]}],
    })  # fmt: skip
    strict_own = start_capped(tmp_path_factory.mktemp("spell-own"), cp, credentials="forward", tls=True, extra={
        "filters": [{"name": "validation", "upstream_validates": "no",
                     "rules": [{"name": "sa", "match": match, "level": "Strict"}]}],
    })  # fmt: skip
    yield Setup(cp, ns, token, enforce, strict, strict_own)
    for rp in (enforce, strict, strict_own):
        rp.stop(signal.SIGKILL)
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")


def _endpoint(rp: RunningProxy) -> Endpoint:
    return Endpoint.from_url(rp.url, ssl.create_default_context(cafile=str(rp.ca_file)))


def send(ep: Endpoint, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
    """One request with these header lines as UTF-8 bytes (Latin-1 cannot carry U+2003; a lone
    surrogate is the byte it escapes)."""
    lines = [("Host", "localhost"), *headers, ("Accept", "application/json")]
    if not any(k.lower() == "content-type" for k, _ in headers):
        lines.append(("Content-Type", "application/json"))
    lines += [("Content-Length", str(len(body)))]
    if not any(k.lower() == "connection" for k, _ in headers):
        lines.append(("Connection", "close"))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines) + "\r\n"
    return exchange(ep, head.encode("utf-8", "surrogateescape") + body)


def reviewed_user(answer: Answer) -> str | None:
    doc = answer.json()
    if answer.status != 201 or not isinstance(doc, dict):
        return None
    return str(doc.get("status", {}).get("userInfo", {}).get("username"))


def _direct(cp: ControlPlaneInfo) -> Endpoint:
    return Endpoint("127.0.0.1", cp.apiserver_port, cp.ssl_context(client_cert=False))


def _persisted(cp: ControlPlaneInfo, ns: str, name: str) -> bool:
    code, data = cp.request("GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
    assert code in (200, 404), data
    return code == 200


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_policy_by_user_holds_for_every_spelling(setup: Setup, spelling: str) -> None:
    headers = SPELLINGS[spelling](setup.token)
    ssr = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    # The spelling authenticates at the apiserver itself...
    direct = send(_direct(setup.cp), "POST", ssr, headers, SSR)
    assert reviewed_user(direct) == setup.user, direct.short()
    # ... and through kproxy the apiserver sees the same caller.
    via = send(_endpoint(setup.strict), "POST", ssr, headers, SSR)
    assert reviewed_user(via) == setup.user, via.short()

    # kproxy's rules by user saw it too: the enforce rule made the write a dry run...
    name = f"cm-{spelling}"[:60]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}
    path = f"/api/v1/namespaces/{setup.ns}/configmaps"
    answer = send(_endpoint(setup.enforce), "POST", path, headers, json.dumps(cm).encode())
    assert answer.status == 201, answer.short()
    assert not _persisted(setup.cp, setup.ns, name), f"{spelling}: persisted through the enforce rule"

    # ... and the Strict rule refused an unknown field (the apiserver's default would store it).
    strict_name = f"st-{spelling}"[:60]
    bad = {**cm, "metadata": {"name": strict_name}, "bogus": 1}
    answer = send(_endpoint(setup.strict), "POST", path, headers, json.dumps(bad).encode())
    assert answer.status == 400 and answer.is_status(), answer.short()
    assert b"bogus" in answer.body, answer.short()
    assert not _persisted(setup.cp, setup.ns, strict_name), f"{spelling}: persisted through the Strict rule"


@pytest.mark.parametrize("spelling", ["\udcff", "\udce3\udc80", "\udcc0\udcaf"])
def test_a_token_that_is_not_utf8_is_the_apiservers_401(setup: Setup, spelling: str) -> None:
    """Go hands the token's bytes to its authenticators as they are; kproxy's TokenReview carries
    them as Go's JSON would (U+FFFD), so the caller gets the apiserver's 401, not kproxy's 500."""
    headers = [("Authorization", f"Bearer {setup.token}{spelling}")]
    ssr = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    direct = send(_direct(setup.cp), "POST", ssr, headers, SSR)
    via = send(_endpoint(setup.strict), "POST", ssr, headers, SSR)
    assert direct.status == 401, direct.short()
    assert (via.status, via.json()) == (direct.status, direct.json()), via.short()


@pytest.mark.parametrize("content_type", ["appl\u0130cation/json", "\u3000application/json", "APPLICATION/JSON\u2003"])
def test_strict_holds_for_content_type_spellings(setup: Setup, content_type: str) -> None:
    """The apiserver reads Content-Type with mime.ParseMediaType (strings.ToLower, which lowers
    U+0130 to "i", then strings.TrimSpace): these are JSON to it, and a Strict rule must hold, also
    where kproxy validates alone (it tells the apiserver to ignore unknown fields then)."""
    path = f"/api/v1/namespaces/{setup.ns}/configmaps"
    headers = [("Authorization", f"Bearer {setup.token}"), ("Content-Type", content_type)]
    for i, rp in enumerate((setup.strict, setup.strict_own)):
        name = f"ct{i}-{abs(hash(content_type)) % 10**8}"
        bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}, "bogus": 1}
        answer = send(_endpoint(rp), "POST", path, headers, json.dumps(bad).encode())
        assert answer.status == 400 and b"bogus" in answer.body, answer.short()
        assert not _persisted(setup.cp, setup.ns, name), f"{content_type!r}: persisted through the Strict rule"
    name = f"ct-{abs(hash(content_type)) % 10**8}"
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}, "bogus": 1}
    # The apiserver itself decodes it as JSON (and stores it, warning about the unknown field).
    direct = send(_direct(setup.cp), "POST", path, headers, json.dumps(bad).encode())
    assert direct.status == 201 and "unknown field" in (direct.header("Warning") or ""), direct.short()
