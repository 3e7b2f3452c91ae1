"""kproxy's own refusals are written as the apiserver writes its errors (``ErrorNegotiated``).

Through ``dryrun`` (a ``reject`` rule's 403, and the 422 for an invalid ``dryRun`` value that
the filter builds itself) and ``validation`` (a Strict answer given locally), for each Accept a
client may send: JSON, YAML, protobuf, a Table conversion (which error writers never honour),
``*/*``, and a pretty request. Where the apiserver can be made to answer the same refusal
(the 422, the Strict 400) the bytes must be its bytes; kproxy's own 403 must have the shape of
the apiserver's answer for that Accept: its media type, its JSON indentation, a body that
decodes to a Status with the rule's code, reason and message.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from kproxy.codec import shared_codec
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

PROTOBUF = "application/vnd.kubernetes.protobuf"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
#: (Accept, extra query, User-Agent)
REQUESTS = [
    ("application/json", "", None),
    ("application/yaml", "", None),
    (PROTOBUF, "", None),
    (f"{PROTOBUF}, application/json", "", None),
    (TABLE, "", None),  # no conversion is acceptable for an error: indented JSON
    (f"{TABLE}, application/json", "", None),
    ("*/*", "", None),
    ("application/json", "&pretty=true", None),
    ("application/json", "", "curl/8.5.0"),  # a human client: pretty
]

Answer = tuple[int, str, bytes]


def send(conn: http.client.HTTPConnection, path: str, body: bytes, accept: str, agent: str | None) -> Answer:
    headers = {"Content-Type": "application/json", "Accept": accept}
    if agent is not None:
        headers["User-Agent"] = agent
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


def status_of(answer: Answer) -> dict[str, Any]:
    """The Status in an answer, whatever its media type."""
    _, ctype, data = answer
    if ctype == PROTOBUF:
        assert data.startswith(b"k8s\x00"), data
        return dict(shared_codec().to_obj(data))
    if ctype == "application/yaml":
        return dict(yaml.safe_load(data))
    assert ctype == "application/json", ctype
    return dict(json.loads(data))


def same_shape(via: Answer, direct: Answer) -> None:
    """kproxy's answer is written as the apiserver writes its own for that request."""
    assert via[1] == direct[1], (via, direct)
    if direct[1] == "application/json":
        assert via[2].startswith(b"{\n") == direct[2].startswith(b"{\n"), (via, direct)  # indented?
        assert via[2].endswith(b"\n") == direct[2].endswith(b"\n"), (via, direct)
    got, ref = status_of(via), status_of(direct)
    assert got["kind"] == ref["kind"] == "Status" and got["apiVersion"] == ref["apiVersion"] == "v1"
    assert got["status"] == ref["status"] == "Failure"


def cm(name: str, **extra: Any) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, **extra}).encode()


@pytest.mark.parametrize(("accept", "query", "agent"), REQUESTS)
def test_dryrun_refusals_are_negotiated(
    control_plane: ControlPlaneInfo,
    namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    accept: str,
    query: str,
    agent: str | None,
) -> None:
    cp = control_plane
    rule = {"name": "no-writes", "match": {"resources": ["configmaps"]}, "action": "reject"}
    rp = proxy_factory(extra={"filters": [{"name": "dryrun", "rules": [rule]}]})
    port = int(rp.url.rsplit(":", 1)[1])

    def direct(path: str) -> Answer:
        conn = http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context())
        return send(conn, path, cm("n"), accept, agent)

    def via(path: str) -> Answer:
        return send(http.client.HTTPConnection("127.0.0.1", port), path, cm("n"), accept, agent)

    base = f"/api/v1/namespaces/{namespace}/configmaps"
    # The 422 for an invalid dryRun value: built by the filter, byte for byte the apiserver's.
    invalid = f"{base}?dryRun=foo{query}"
    ref = direct(invalid)
    assert ref[0] == 422, ref
    assert via(invalid) == ref
    # The reject rule's 403 is kproxy's alone: the apiserver's shape for this Accept.
    refused = via(f"{base}?x=1{query}")
    assert refused[0] == 403, refused
    same_shape(refused, ref)
    status = status_of(refused)
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    assert 'kproxy dryrun rule "no-writes" allows only dry-run requests' in status["message"]
    assert status["details"] == {"kind": "configmaps"}
    assert cp.request("GET", f"{base}/n")[0] == 404


@pytest.mark.parametrize("upstream_validates", ["auto", "no"])
def test_validation_strict_answers_are_negotiated(
    control_plane: ControlPlaneInfo,
    namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    upstream_validates: str,
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "validation", "upstream_validates": upstream_validates}]})
    port = int(rp.url.rsplit(":", 1)[1])
    body = cm("m", bogus=1, data={"a": "1"})
    for accept, query, agent in REQUESTS:
        path = f"/api/v1/namespaces/{namespace}/configmaps?fieldValidation=Strict{query}"
        ref = send(
            http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context()),
            path, body, accept, agent,
        )  # fmt: skip
        assert ref[0] == 400, (accept, ref)
        got = send(http.client.HTTPConnection("127.0.0.1", port), path, body, accept, agent)
        assert got == ref, (accept, query, agent, got, ref)
        assert 'unknown field "bogus"' in status_of(got)["message"]
    assert cp.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/m")[0] == 404
