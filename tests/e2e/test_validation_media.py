"""The validation filter's own Strict answers in every media type a client can negotiate.

The apiserver writes a Strict decoding error as a Status in the negotiated type: JSON, YAML or
protobuf (client-go's protobuf clients, and the ``transcode`` filter when it sits in front of
``validation``: it asks for ``protobuf, <client's Accept>``). kproxy's local answer must be the
same bytes, in front of a validating upstream and when kproxy provides the validation itself;
an Accept the apiserver refuses gets its 406 (before any decoding, so nothing is stored).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

PROTOBUF = "application/vnd.kubernetes.protobuf"
#: (Accept, the Content-Type the apiserver answers with, whether kproxy answers itself)
ACCEPTS = [
    ("application/json", "application/json", True),
    ("application/yaml", "application/yaml", True),
    (PROTOBUF, PROTOBUF, True),
    (f"{PROTOBUF}, application/json", PROTOBUF, True),
    ("application/yaml;q=0.5, application/json;q=0.9", "application/json", True),
    ("text/html", "application/json", False),  # the apiserver's 406
    ("application/*", "application/json", False),  # go-restful's route check: 406 too
]


def post(conn: http.client.HTTPConnection, path: str, body: bytes, accept: str) -> tuple[int, str, bytes, bool]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "Accept": accept})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, resp.getheader("Content-Type", ""), data, resp.getheader("Audit-Id") is None


@pytest.mark.parametrize("upstream_validates", ["auto", "no"])
def test_strict_answers_in_the_negotiated_media_type(
    control_plane: ControlPlaneInfo,
    namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    upstream_validates: str,
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "validation", "upstream_validates": upstream_validates}]})
    port = int(rp.url.rsplit(":", 1)[1])
    body = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "m"}, "bogus": 1, "data": {"a": "1"}}
    ).encode()
    path = f"/api/v1/namespaces/{namespace}/configmaps?fieldValidation=Strict"
    for accept, media, local in ACCEPTS:
        direct = post(http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context()),
                      path, body, accept)  # fmt: skip
        via = post(http.client.HTTPConnection("127.0.0.1", port), path, body, accept)
        assert direct[:2] == (400 if local else 406, media), (accept, direct)
        assert via[:3] == direct[:3], (accept, via, direct)
        assert via[3] == local, (accept, "answered by kproxy" if via[3] else "answered by the apiserver")
        if media == PROTOBUF:
            assert via[2].startswith(b"k8s\x00") and b'unknown field \\"bogus\\"'.replace(b"\\", b"") in via[2]
    assert cp.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/m")[0] == 404
