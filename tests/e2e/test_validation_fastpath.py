"""The validation filter's clean path (msgspec Structs) on bodies at its edges, through a real
kproxy and the real apiserver: deeply nested bodies (deeper than the Python checks recurse) and
clean bodies in the shapes real clients send get the apiserver's own answers, never a kproxy
error."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy


def nested(depth: int, obj: bool) -> str:
    return '{"a":' * depth + "1" + "}" * depth if obj else "[" * depth + "]" * depth


def deployment(name: str) -> dict[str, Any]:
    container = {
        "name": "app",
        "image": "registry.example.com/app:1",
        "ports": [{"containerPort": 8080}],
        "env": [{"name": "A", "value": "x:y"}],
        "resources": {"limits": {"cpu": 0.5, "memory": "64Mi"}},  # a float Quantity: Raw in the Structs
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}, "annotations": {"note": 'a "quoted" <value>/é'}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    }


def bodies(namespace: str) -> list[tuple[str, str, str]]:
    """(label, collection path, body text)."""
    cm = f"/api/v1/namespaces/{namespace}/configmaps"
    cr = f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions"
    dep = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    out = []
    for depth in (300, 600, 3000):
        # A wrong type nested deep (the apiserver's decode error), and a deep RawExtension.
        data = nested(depth, False)
        out.append((f"configmap-{depth}", cm, f'{{"metadata":{{"name":"d{depth}"}},"data":{{"k":{data}}}}}'))
        data = nested(depth, True)
        out.append((f"revision-{depth}", cr, f'{{"metadata":{{"name":"r{depth}"}},"revision":1,"data":{data}}}'))
    clean = deployment("web")
    compact = json.dumps(clean, separators=(",", ":"), ensure_ascii=False)
    out += [
        ("deployment compact", dep, compact),
        ("deployment spaced", dep, json.dumps(clean)),  # \\u escapes, white space
        ("deployment sorted", dep, json.dumps(clean, sort_keys=True, separators=(",", ":"))),
        ("deployment duplicate", dep, compact.replace('"replicas":1', '"replicas":1,"replicas":2')),
        ("deployment unknown", dep, json.dumps({**clean, "bogus": {"x": 1}}, separators=(",", ":"))),
        ("deployment float replicas", dep, compact.replace('"replicas":1', '"replicas":1.5')),
    ]
    return out


def comparable(status: int, body: bytes) -> tuple[int, bytes]:
    """A created object without its metadata (uid, time and field manager differ between two
    creations), cut out of the text: the deep RawExtension is too deep to parse here."""
    if status != 201:
        return status, body
    start = body.index(b'"metadata":') + len(b'"metadata":')
    depth, i, in_string = 0, start, False
    while True:
        c = body[i : i + 1]
        if in_string:
            if c == b"\\":
                i += 1
            elif c == b'"':
                in_string = False
        elif c == b'"':
            in_string = True
        elif c == b"{":
            depth += 1
        elif c == b"}":
            depth -= 1
            if depth == 0:
                return status, body[:start] + body[i + 1 :]
        i += 1


async def test_edge_bodies_get_the_apiservers_answers(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    rp = proxy_factory(extra={"filters": [{"name": "validation"}]})
    query = "?dryRun=All&fieldValidation=Strict"
    local = 0
    async with aiohttp.ClientSession() as s:
        for label, path, text in bodies(namespace):
            data = text.encode()
            direct = comparable(*control_plane.request("POST", path + query, body=data))
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            async with s.post(rp.url + path + query, data=data, headers=headers) as resp:
                got = comparable(resp.status, await resp.read())
                local += "Audit-Id" not in resp.headers
            assert got == direct, f"{label}: direct {str(direct)[:300]}, kproxy {str(got)[:300]}"
            assert direct[0] in (201, 400), label
    assert local == 2  # the duplicate and the unknown field were answered by kproxy itself
    assert "Traceback" not in rp.log_text()
