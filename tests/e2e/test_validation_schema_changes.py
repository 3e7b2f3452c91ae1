"""A CRD whose schema changes while kproxy runs: kproxy never answers with the old schema.

The apiserver republishes a CRD's OpenAPI document asynchronously; kproxy watches CRDs and
leaves a changed group to the apiserver for ``settle_seconds``, then validates with the new
document."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any

import aiohttp

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.eventually import eventually_async
from kproxy.testing.proxyproc import RunningProxy

GROUP = f"sc{secrets.token_hex(3)}.kproxy.test"  # a fresh CRD per run: the test changes it


def gizmo(**spec: Any) -> bytes:
    return json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Gizmo", "metadata": {"name": "g"}, "spec": spec}).encode()


async def post(s: aiohttp.ClientSession, url: str, body: bytes, sslctx: Any) -> tuple[int, bytes, bool]:
    async with s.post(url, data=body, headers={"Content-Type": "application/json"}, ssl=sslctx) as r:
        return r.status, await r.read(), "Audit-Id" not in r.headers


async def test_a_changed_crd_is_never_validated_with_its_old_schema(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "validation", "settle_seconds": 3}]})
    direct_ssl = cp.ssl_context()
    path = f"/apis/{GROUP}/v1/namespaces/{namespace}/gizmos?dryRun=All&fieldValidation=Strict"
    code, body = cp.request(
        "POST", crds.CRDS, body=json.dumps(crds.crd(GROUP, "gizmos", "Gizmo", spec_fields={"a": "string"})).encode()
    )
    assert code == 201, body
    async with aiohttp.ClientSession() as s:
        # Once the document is published and the group settled, kproxy answers locally.
        async def local_400() -> Any:
            got = await post(s, rp.url + path, gizmo(a="1", b="2"), None)
            return got if got[0] == 400 and got[2] else None

        status, text, _ = await eventually_async(local_400, 30, "a local Strict answer", 0.2)
        assert b'unknown field \\"spec.b\\"' in text
        # Now spec.b is declared. As soon as the apiserver accepts it, so does kproxy: every answer
        # from then on is a 201, never a 400 from the old schema.
        current = json.loads(cp.request("GET", f"{crds.CRDS}/gizmos.{GROUP}")[1])
        current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["b"] = {
            "type": "string"
        }
        code, body = cp.request("PUT", f"{crds.CRDS}/gizmos.{GROUP}", body=json.dumps(current).encode())
        assert code == 200, body

        async def direct_accepts() -> bool:
            return (await post(s, cp.server + path, gizmo(a="1", b="2"), direct_ssl))[0] == 201

        await eventually_async(direct_accepts, 30, "the apiserver to use the new schema", 0.2)
        answers = []
        for _ in range(40):  # through the settle window and beyond (3 s + index re-read)
            answers.append((await post(s, rp.url + path, gizmo(a="1", b="2"), None))[0])
            await asyncio.sleep(0.2)
        assert set(answers) == {201}, answers
        # And kproxy validates with the new document: only spec.c is unknown now.
        status, text, local = await eventually_async(
            lambda: _local(s, rp.url + path), 30, "a local answer with the new schema", 0.2
        )
        assert status == 400 and local
        assert b'strict decoding error: unknown field \\"spec.c\\""' in text


async def _local(s: aiohttp.ClientSession, url: str) -> Any:
    got = await post(s, url, gizmo(a="1", b="2", c="3"), None)
    return got if got[2] else None
