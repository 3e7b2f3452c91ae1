"""`credentials: impersonate`: whatever a caller's identity holds (certificate CN and O here, the
strings an attacker chooses when it can get a certificate signed) and whatever ``Impersonate-*``
headers it sends, the apiserver sees exactly the caller kproxy authenticated, or kproxy refuses.

Each case asserts, at the apiserver: a SelfSubjectReview through kproxy names exactly the
certificate's user and groups (or is refused with a Status), and a write the caller has no right
to was not persisted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .bodies import cm_json
from .conftest import Twins, caller_context
from .wire import Answer, Endpoint, exchange, request_bytes

SSR = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'


@dataclass(frozen=True)
class IdCase:
    id: str
    cn: str
    groups: tuple[str, ...] = ("adv-callers",)
    headers: tuple[tuple[str, str], ...] = ()
    known: str | None = None


ID_CASES = [
    IdCase("plain", "adv-eve"),
    IdCase("cn-crlf-header", "eve\r\nImpersonate-Group: system:masters"),
    IdCase("cn-lf-header", "eve\nImpersonate-Group: system:masters"),
    IdCase("cn-cr-header", "eve\rImpersonate-Group: system:masters"),
    IdCase("cn-crlf-crlf-request", "eve\r\n\r\nGET / HTTP/1.1"),
    IdCase("cn-nul", "eve\x00system:admin"),
    IdCase("cn-del", "eve\x7f"),
    IdCase("cn-tab-inside", "eve\tx"),
    IdCase("cn-surrounding-blanks", " adv-eve "),
    IdCase("cn-unicode", "ēve-ünï"),
    IdCase("o-crlf-header", "adv-eve", ("dev\r\nImpersonate-Group: system:masters",)),
    IdCase("o-comma", "adv-eve", ("a,system:masters",)),
    IdCase("o-two", "adv-eve", ("g1", "g2")),
    IdCase("caller-impersonate-user", "adv-eve", headers=(("Impersonate-User", "system:admin"),)),
    IdCase("caller-impersonate-group-lower", "adv-eve", headers=(("impersonate-group", "system:masters"),)),
    IdCase("caller-impersonate-uid-extra", "adv-eve",
           headers=(("Impersonate-Uid", "0"), ("Impersonate-Extra-Scopes", "all"))),
    IdCase("caller-obs-fold", "adv-eve", headers=(("X-Adv", "a\r\n Impersonate-Group: system:masters"),)),
    IdCase("caller-header-space-colon", "adv-eve", headers=(("Impersonate-Group ", "system:masters"),)),
]


def _caller_endpoint(rp: RunningProxy, ca: certs.CertKey, case: IdCase, tmp: Path) -> Endpoint:
    return Endpoint.from_url(rp.url, caller_context(rp, ca, tmp, case.cn, list(case.groups)))


def _send(ep: Endpoint, case: IdCase, method: str, target: str, body: bytes) -> tuple[bytes, Answer]:
    headers = [("Accept", "application/json"), ("Content-Type", "application/json"), *case.headers]
    raw = request_bytes(method, target, headers, body)
    return raw, exchange(ep, raw)


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.known)] if c.known else [])
             for c in ID_CASES],
)  # fmt: skip
def test_the_apiserver_sees_exactly_the_caller(
    case: IdCase,
    imp: RunningProxy,
    caller_ca: certs.CertKey,
    twins: Twins,
    tmp_path: Path,
    control_plane: ControlPlaneInfo,
) -> None:
    ep = _caller_endpoint(imp, caller_ca, case, tmp_path)
    raw, review = _send(ep, case, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", SSR)
    assert imp.proc.poll() is None, f"kproxy exited; raw={raw!r}"
    if review.status == 201:
        seen = review.json()["status"]["userInfo"]
        expected = {"username": case.cn, "groups": sorted([*case.groups, "system:authenticated"])}
        got = {"username": seen.get("username"), "groups": sorted(seen.get("groups", []))}
        # The one extra the apiserver's x509 authenticator gives a certificate caller (x509.go).
        extra = {k for k in seen.get("extra") or {} if k != "authentication.kubernetes.io/credential-id"}
        assert got == expected and not extra and not seen.get("uid"), f"{seen}; raw={raw!r}"
    elif not review.is_status():  # refused at the HTTP edge: as Go's server refuses it (anonymous, directly)
        anonymous = control_plane.ssl_context(client_cert=False)
        direct = exchange(Endpoint("127.0.0.1", control_plane.apiserver_port, anonymous), raw)
        assert (review.status, False) == (direct.status, direct.is_status()), (review.short(), direct.short(), raw)
    else:
        assert 400 <= review.status < 500, f"{review.short()}; raw={raw!r}"

    name = f"imp-{case.id}"
    raw, write = _send(ep, case, "POST", f"/api/v1/namespaces/{twins.via}/configmaps", cm_json(name))
    persisted = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/{name}")
    assert persisted is None, f"the caller (no RBAC) created {name}: {write.short()}; raw={raw!r}"
    edge_refusal = review.status == 400 and not review.is_status()
    assert 400 <= write.status < 500 and write.is_status() != edge_refusal, write.short()
    assert "Traceback" not in imp.log_text()
