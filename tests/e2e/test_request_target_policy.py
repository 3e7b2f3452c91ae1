"""Policy filters see the request the apiserver will serve, however its target and query are spelled.

Go's server routes an absolute-form target (``POST http://any-host/api/...``) by its path and reads
the query with ``url.ParseQuery`` (``;`` and bad escapes drop a pair; over 10,000 parameters it
reads none). kproxy must classify and enforce on that same reading. Every verdict here is read
at the apiserver: what was persisted, what token was minted."""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from collections.abc import Iterator

import pytest

from kproxy.gocompat.url import MAX_QUERY_PARAMS
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

Answer = tuple[int, dict[str, list[str]], bytes]


class Sides:
    """Raw requests through kproxy (forward mode, admin token) and directly to the apiserver."""

    def __init__(self, cp: ControlPlaneInfo, rp: RunningProxy) -> None:
        assert rp.ca_file is not None
        self.cp = cp
        self.rp_port = int(rp.url.rsplit(":", 1)[1])
        self.rp_ssl = ssl.create_default_context(cafile=str(rp.ca_file))
        self.direct_ssl = cp.ssl_context(client_cert=False)

    def _send(self, port: int, ctx: ssl.SSLContext, method: str, target: str, body: bytes | None) -> Answer:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=30)
        try:
            headers = {
                "Host": f"127.0.0.1:{port}",  # as sent; http.client would derive one from an absolute target
                "Authorization": f"Bearer {self.cp.admin_token}",
                "Accept": "application/json",
            }
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            found: dict[str, list[str]] = {}
            for k, v in resp.getheaders():
                found.setdefault(k.lower(), []).append(v)
            return resp.status, found, resp.read()
        finally:
            conn.close()

    def via(self, method: str, target: str, body: bytes | None = None) -> Answer:
        return self._send(self.rp_port, self.rp_ssl, method, target, body)

    def direct(self, method: str, target: str, body: bytes | None = None) -> Answer:
        return self._send(self.cp.apiserver_port, self.direct_ssl, method, target, body)

    def exists(self, path: str) -> bool:
        status, _, data = self.direct("GET", path)
        assert status in (200, 404), data
        return status == 200


def cm(name: str, **extra: object) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, **extra}).encode()


@pytest.fixture(scope="module")
def namespaces(control_plane: ControlPlaneInfo) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    dry, strict = f"dry-{suffix}", f"strict-{suffix}"
    for ns in (dry, strict):
        body = json.dumps({"metadata": {"name": ns}}).encode()
        assert control_plane.request("POST", "/api/v1/namespaces", body=body)[0] == 201
        sa = json.dumps({"metadata": {"name": "bot"}}).encode()
        assert control_plane.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)[0] == 201
    yield dry, strict
    for ns in (dry, strict):
        control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
def sides(
    control_plane: ControlPlaneInfo, namespaces: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sides]:
    dry, strict = namespaces
    filters = [
        {"name": "dryrun", "rules": [{"name": "preview", "match": {"namespaces": [dry]}, "action": "enforce"}]},
        {
            "name": "validation",
            "rules": [{"name": "strict", "match": {"namespaces": [strict]}, "level": "Strict"}],
        },
    ]
    rp = start_proxy(
        tmp_path_factory.mktemp("target-policy"),
        control_plane.admin_kubeconfig,
        credentials="forward",
        tls=True,
        extra={"filters": filters},
    )
    yield Sides(control_plane, rp)
    rp.stop()


ABSOLUTE_FORMS = [
    "http://x{path}",
    "https://evil.example.com:443{path}",
    "HTTP://X{path}",
    "ws://host:1{path}",
    "http://[::1]:1{path}",
    "h2c://u:p@host{path}",
    "http:{path}",
]


@pytest.mark.parametrize("form", ABSOLUTE_FORMS)
def test_absolute_form_create_is_still_a_dry_run(sides: Sides, namespaces: tuple[str, str], form: str) -> None:
    dry, _ = namespaces
    name = f"abs-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/namespaces/{dry}/configmaps"
    status, headers, data = sides.via("POST", form.format(path=path), cm(name, data={"a": "1"}))
    assert status == 201, data
    assert any("ran this request as a dry run" in w for w in headers.get("warning", [])), headers
    assert not sides.exists(f"{path}/{name}")


def test_absolute_form_cannot_mint_a_token(sides: Sides, namespaces: tuple[str, str]) -> None:
    dry, _ = namespaces
    path = f"/api/v1/namespaces/{dry}/serviceaccounts/bot/token"
    body = b'{"spec":{"expirationSeconds":600}}'
    origin = sides.via("POST", path, body)
    assert origin[0] == 403, origin
    for form in ABSOLUTE_FORMS:
        status, _, data = sides.via("POST", form.format(path=path), body)
        assert (status, data) == (origin[0], origin[2]), (form, data)
        assert status in (400, 403) and b'"token"' not in data


@pytest.mark.parametrize("form", ["{path}", *ABSOLUTE_FORMS])
def test_absolute_form_meets_strict_validation(sides: Sides, namespaces: tuple[str, str], form: str) -> None:
    _, strict = namespaces
    name = f"strict-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/namespaces/{strict}/configmaps"
    body = cm(name, bogus=1)
    direct = sides.direct("POST", f"{path}?fieldValidation=Strict&dryRun=All", body)
    assert direct[0] == 400, direct
    status, _, data = sides.via("POST", form.format(path=path), body)
    assert (status, data) == (direct[0], direct[2])
    assert not sides.exists(f"{path}/{name}")


OVER_LIMIT = "&".join(["p=1"] * MAX_QUERY_PARAMS)


@pytest.mark.parametrize(
    "query",
    [
        "fieldValidation=%zz&fieldValidation=Ignore",
        "fieldValidation=%",
        "fieldValidation=Ignore;",
        "fieldValidation=Strict%zz",
        "fieldValidation=Ignore;x&fieldValidation=Ignore",
        "%66ieldValidation=Ignore",
        "fieldValidation=Ignore&fieldValidation=Strict",
        OVER_LIMIT + "&fieldValidation=Ignore",
    ],
    ids=lambda q: q if len(q) < 80 else f"{MAX_QUERY_PARAMS}+ parameters",
)
def test_query_spellings_cannot_lower_strict(sides: Sides, namespaces: tuple[str, str], query: str) -> None:
    _, strict = namespaces
    name = f"q-{uuid.uuid4().hex[:8]}"
    path = f"/api/v1/namespaces/{strict}/configmaps"
    direct = sides.direct("POST", f"{path}?fieldValidation=Strict&dryRun=All", cm(name, bogus=1))
    status, _, data = sides.via("POST", f"{path}?{query}", cm(name, bogus=1))
    assert (status, data) == (direct[0], direct[2])
    assert not sides.exists(f"{path}/{name}")


def test_a_query_over_gos_parameter_limit_is_still_a_dry_run(sides: Sides, namespaces: tuple[str, str]) -> None:
    """Over 10,000 parameters Go's server reads none: kproxy's enforced dryRun must not be one of
    the parameters it drops."""
    dry, _ = namespaces
    path = f"/api/v1/namespaces/{dry}/configmaps"
    # Over the limit already: the apiserver reads only the dryRun=All kproxy leaves.
    over = f"q-{uuid.uuid4().hex[:8]}"
    status, _, data = sides.via("POST", f"{path}?{OVER_LIMIT}&x=1", cm(over))
    assert status == 201, data
    # At the limit: one more parameter and Go would read none, so kproxy refuses.
    at = f"q-{uuid.uuid4().hex[:8]}"
    status, _, data = sides.via("POST", f"{path}?{OVER_LIMIT}", cm(at))
    assert status == 400 and json.loads(data)["kind"] == "Status", data
    assert not sides.exists(f"{path}/{over}") and not sides.exists(f"{path}/{at}")


@pytest.mark.parametrize(
    "target",
    ["/api/v1/namespaces/default/configmaps/%zz", "http://h:x/api/v1/namespaces", "http://h%2F/api/v1/namespaces"],
)
def test_targets_go_refuses_get_gos_400(sides: Sides, target: str) -> None:
    status, headers, data = sides.via("GET", target)
    direct = sides.direct("GET", target)
    assert (status, data, headers.get("content-type")) == (direct[0], direct[2], direct[1].get("content-type"))
    assert status == 400 and data == b"400 Bad Request"
