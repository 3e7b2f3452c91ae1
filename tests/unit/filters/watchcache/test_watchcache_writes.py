"""written_rv: the resource version of the object in a write's answer, JSON or protobuf.

Pure logic (end to end: tests/e2e/test_watchcache_write_order.py).
"""

from __future__ import annotations

import json

import pytest

from kproxy.codec import encode_envelope, shared_codec
from kproxy.filters.watchcache.writes import written_rv

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": "4321"}}


def test_json_object() -> None:
    assert written_rv(json.dumps(CONFIG_MAP).encode() + b"\n") == 4321


def test_protobuf_object() -> None:
    body = shared_codec().from_json(json.dumps(CONFIG_MAP).encode())
    assert body.startswith(b"k8s\x00")
    assert written_rv(body) == 4321


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}',
        b'{"metadata":{"resourceVersion":""}}',
        b'{"metadata":{"resourceVersion":"12a"}}',
        b'{"metadata":{"resourceVersion":"\xd9\xa1"}}',
        b'{"metadata":"x"}',
        b"[1]",
        b"{not json",
        b"apiVersion: v1\nkind: ConfigMap\n",
        b"k8s\x00\xff\xff",
        b"",
    ],
)
def test_no_resource_version(body: bytes) -> None:
    assert written_rv(body) is None


def test_protobuf_status_has_none() -> None:
    status = shared_codec().from_json(json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success"}).encode())
    assert written_rv(status) is None
    assert written_rv(encode_envelope("v1", "ConfigMap", b"\x0a\x00")) is None
