"""The one Status writer: ``Reply.from_status(err, ex)`` negotiates as ``ErrorNegotiated`` does."""

from __future__ import annotations

import json

import pytest
import yaml
from multidict import CIMultiDict

from kproxy.codec import shared_codec
from kproxy.core.chain import BytesBody, Exchange, Reply
from kproxy.core.errorreply import negotiated_media
from kproxy.core.requestinfo import request_info_from_target
from kproxy.core.status import CauseType, StatusCause, invalid

PROTOBUF = "application/vnd.kubernetes.protobuf"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
ERR = invalid("CreateOptions", "meta.k8s.io", "", [StatusCause(CauseType.FIELD_VALUE_NOT_SUPPORTED, "bad", "dryRun")])


def ex(accept: str | None, query: str = "", agent: str | None = None) -> Exchange:
    headers: CIMultiDict[str] = CIMultiDict()
    if accept is not None:
        headers["Accept"] = accept
    if agent is not None:
        headers["User-Agent"] = agent
    target = "/api/v1/namespaces/ns/configmaps" + (f"?{query}" if query else "")
    return Exchange(
        "POST", target.partition("?")[0], query, headers, BytesBody(b""), request_info_from_target("POST", target)
    )


@pytest.mark.parametrize(
    ("accept", "query", "agent", "media", "pretty"),
    [
        (None, "", None, "application/json", False),
        ("application/json", "", None, "application/json", False),
        ("*/*", "", None, "application/json", False),
        ("application/yaml", "", None, "application/yaml", False),
        (PROTOBUF, "", None, PROTOBUF, False),
        (f"{PROTOBUF}, application/json", "", None, PROTOBUF, False),
        (TABLE, "", None, "application/json", True),  # nothing acceptable: WriteRawJSON, indented
        (f"{TABLE}, application/json", "", None, "application/json", False),
        ("application/json", "pretty=true", None, "application/json", True),
        ("application/json", "", "curl/8.5.0", "application/json", True),
        ("application/json;pretty=1", "", None, "application/json", True),
    ],
)
def test_negotiated_media(accept: str | None, query: str, agent: str | None, media: str, pretty: bool) -> None:
    e = ex(accept, query, agent)
    assert negotiated_media(e.headers, e.query) == (media, pretty)


def test_from_status_writes_each_media_type() -> None:
    as_json = Reply.from_status(ERR, ex("application/json"))
    assert as_json.status == 422 and as_json.headers["Content-Type"] == "application/json"
    data = as_json.body.data  # type: ignore[union-attr]
    assert data == ERR.body() and data.endswith(b"\n")
    as_yaml = Reply.from_status(ERR, ex("application/yaml"))
    assert as_yaml.headers["Content-Type"] == "application/yaml"
    assert yaml.safe_load(as_yaml.body.data) == json.loads(ERR.body())  # type: ignore[union-attr]
    as_pb = Reply.from_status(ERR, ex(PROTOBUF))
    assert as_pb.headers["Content-Type"] == PROTOBUF
    assert shared_codec().to_obj(as_pb.body.data) == json.loads(ERR.body())  # type: ignore[union-attr]
    raw = Reply.from_status(ERR, ex(TABLE))
    assert raw.body.data == ERR.body(pretty=True) and not raw.body.data.endswith(b"\n")  # type: ignore[union-attr]
