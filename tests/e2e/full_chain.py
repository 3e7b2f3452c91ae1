"""Helpers for test_full_chain_python: kproxy with every built-in filter, and raw HTTP to both sides.

One kproxy runs the whole chain in the order config.example.yaml recommends (compression
outermost, then transcode, dryrun, validation, watchcache), over TLS with `credentials: forward`;
the same bearer token (a `system:masters` user) is used straight to the apiserver and through
kproxy, so the two answers can be compared word for word.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client

from kproxy.localcluster.envtest import ControlPlaneInfo

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"

DRY_RULE = "dry-namespaces"
FILTERS: list[dict[str, Any]] = [
    {"name": "compression", "watch": True},
    {"name": "transcode", "upstream": "protobuf"},
    {"name": "dryrun", "rules": [{"name": DRY_RULE, "match": {"namespaces": ["dry-*"]}, "action": "enforce"}]},
    {
        "name": "validation",
        "rules": [
            {"name": "strict-namespaces", "match": {"namespaces": ["strict-*"]}, "level": "Strict"},
            {"name": "warn-elsewhere", "level": "Warn"},
        ],
    },
    {"name": "watchcache", "resources": ["pods", "configmaps"]},
]
#: The order docs/using/configuration.md#the-order-that-works shows (the cache outside the policies,
#: transcode innermost).
README_ORDER = ["compression", "watchcache", "dryrun", "validation", "transcode"]
ORDERS: dict[str, list[dict[str, Any]]] = {
    "config-example-order": FILTERS,
    "readme-order": [next(f for f in FILTERS if f["name"] == name) for name in README_ORDER],
}


@dataclass
class Raw:
    """One HTTP answer, its body decoded of any Content-Encoding."""

    status: int
    headers: urllib3.HTTPHeaderDict
    body: bytes
    url: str = ""

    @property
    def content_type(self) -> str:
        return str(self.headers.get("Content-Type", ""))

    def json(self) -> Any:
        return json.loads(self.body)

    def status_fields(self) -> tuple[int, str, Any, Any, Any]:
        """(HTTP code, Content-Type, Status reason, message, code) of a Status answer."""
        doc = self.json()
        return self.status, self.content_type, doc.get("reason"), doc.get("message"), doc.get("code")

    def warnings(self) -> list[str]:
        return list(self.headers.getlist("Warning"))


class Side:
    """Raw HTTPS requests to one side (the apiserver or kproxy) as the admin token's user."""

    def __init__(self, base: str, ca_file: Path, token: str) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(ca_file), retries=False)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | list[tuple[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 60,
    ) -> Raw:
        url = self.base + path + (("?" + urlencode(query)) if query else "")
        hdrs = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        resp = self.pool.request(method, url, headers=hdrs, body=body, timeout=timeout, preload_content=True)
        return Raw(resp.status, resp.headers, resp.data, url)

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
    ) -> urllib3.BaseHTTPResponse:
        """A streaming GET (a watch); the caller reads and releases it."""
        url = self.base + path + (("?" + urlencode(query)) if query else "")
        hdrs = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        return self.pool.request(
            "GET", url, headers=hdrs, preload_content=False, timeout=urllib3.Timeout(connect=10, read=60)
        )


def api_client(base: str, ca_file: Path, token: str) -> client.ApiClient:
    """The official client, authenticated by bearer token (as kubectl would be through kproxy)."""
    cfg = client.Configuration()
    cfg.host = base
    cfg.ssl_ca_cert = str(ca_file)
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def make_namespace(cp: ControlPlaneInfo, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, resp = cp.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
    assert code == 201, resp[:300]
    return name


def drop_namespace(cp: ControlPlaneInfo, name: str) -> None:
    cp.request("DELETE", f"/api/v1/namespaces/{name}")


def plain(api: client.ApiClient, obj: Any) -> Any:
    """A model object as the JSON-shaped dict the client would send."""
    return api.sanitize_for_serialization(obj)


def without(doc: Any, *paths: str) -> Any:
    """A deep copy of a dict without the given dotted paths (values that legitimately differ)."""
    doc = json.loads(json.dumps(doc))
    for path in paths:
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(last, None)
    return doc


def watch_lines(resp: urllib3.BaseHTTPResponse) -> Iterator[dict[str, Any]]:
    """JSON watch events from a streaming response, one per line, as they arrive."""
    buf = b""
    for chunk in resp.stream(None, decode_content=True):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
