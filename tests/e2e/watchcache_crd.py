"""A custom resource for the watch-cache differential tests, and a kproxy caching it.

Custom resources take other paths than built-ins on both sides: the apiserver serves them as
unstructured JSON (keys sorted, Go's number formatting, no protobuf: 406), with the CRD's own
selectable fields and printer columns. The widgets here carry the values that catch re-encoders
out: floats with and without fractions, large integers, exponents, keys out of order, HTML
characters, unknown fields kept by ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from watchcache_population import PASSTHROUGH_ENV

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

GROUP = "wcdiff.example.com"
PLURAL = "widgets"
CRD_NAME = f"{PLURAL}.{GROUP}"


@dataclass
class Widgets:
    namespaces: list[str]
    names: dict[str, list[str]]
    recent_rv: int

    def path(self, ns: str | None = None) -> str:
        return f"/apis/{GROUP}/v1/namespaces/{ns}/{PLURAL}" if ns else f"/apis/{GROUP}/v1/{PLURAL}"


CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "selectableFields": [{"jsonPath": ".spec.color"}, {"jsonPath": ".spec.size"}],
                "additionalPrinterColumns": [
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "color": {"type": "string"},
                                    "size": {"type": "integer"},
                                    "ratio": {"type": "number"},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}

#: Numbers whose text a decode-and-re-encode would change (Go prints float64 with %v-like rules).
_NUMBERS: list[Any] = [1.0, 0.1, 1e21, 1.5e-7, 123456789.0, 2**53 + 1, -0.0, 100, 3.14159265358979, 1e6]


def _widget(ns: str, i: int) -> dict[str, Any]:
    labels = {"shape": ("round", "square", "flat")[i % 3]}
    if i % 4 == 0:
        labels = {}
    spec: dict[str, Any] = {
        "color": ("red", "green", "blue")[i % 3],
        "size": i * 7 % 11,
        "ratio": _NUMBERS[i % len(_NUMBERS)],
        "zeta": {"b": 1, "a": [3, 2.5, {"y": None, "x": True}]},
        "html": "<a href='x'>&</a>",
        "unicode": "日本\u2028",
        "extra": _NUMBERS[(i + 3) % len(_NUMBERS)],
    }
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": f"w-{(i * 7) % 20:02d}", "namespace": ns, "labels": labels},
        "spec": spec,
    }


async def _call(session: aiohttp.ClientSession, cp: ControlPlaneInfo, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    async with session.request(method, cp.server + path, data=data, headers=headers) as resp:
        text = await resp.read()
        if resp.status >= 300 and not (method == "DELETE" and resp.status == 404):
            raise AssertionError(f"{method} {path}: HTTP {resp.status}: {text[:300]!r}")
        return json.loads(text) if text else None


async def _create(cp: ControlPlaneInfo) -> Widgets:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=cp.ssl_context())) as s:
        await _call(s, cp, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        deadline = time.monotonic() + 60
        while True:  # a CRD from an earlier run may still be going away
            try:
                await _call(s, cp, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        while True:  # established, and the endpoint served
            crd = await _call(s, cp, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
            conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                try:
                    await _call(s, cp, "GET", f"/apis/{GROUP}/v1/{PLURAL}?limit=1")
                    break
                except AssertionError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {CRD_NAME} not established: {crd.get('status')}")
            await asyncio.sleep(0.1)
        suffix = secrets.token_hex(3)
        namespaces = [f"wcdiff-crd-{suffix}", f"wcdiff-crd-{suffix}-b"]
        for ns in namespaces:
            await _call(
                s, cp, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
        names: dict[str, list[str]] = {ns: [] for ns in namespaces}
        objs = [_widget(namespaces[i % 2], i) for i in range(20)]
        for o in objs:
            names[o["metadata"]["namespace"]].append(o["metadata"]["name"])
        await asyncio.gather(
            *(
                _call(s, cp, "POST", f"/apis/{GROUP}/v1/namespaces/{o['metadata']['namespace']}/{PLURAL}", o)
                for o in objs
            )
        )
        rv = int((await _call(s, cp, "GET", f"/apis/{GROUP}/v1/{PLURAL}?limit=1"))["metadata"]["resourceVersion"])
        return Widgets(namespaces, names, rv)


async def _delete(cp: ControlPlaneInfo, w: Widgets) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=cp.ssl_context())) as s:
        await _call(s, cp, "DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
        for ns in w.namespaces:
            await _call(s, cp, "DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
async def widgets(control_plane: ControlPlaneInfo) -> AsyncIterator[Widgets]:
    w = await _create(control_plane)
    yield w
    await _delete(control_plane, w)


@pytest.fixture(scope="module")
def widget_proxy(
    control_plane: ControlPlaneInfo, widgets: Widgets, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy caching the widgets (named GROUP/VERSION/RESOURCE) after they exist."""
    flt = (
        []
        if os.environ.get(PASSTHROUGH_ENV) == "1"
        else [{"name": "watchcache", "resources": [f"{GROUP}/v1/{PLURAL}"]}]
    )
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-watchcache-crd"), control_plane.admin_kubeconfig, extra={"filters": flt}
    )
    yield rp
    rp.stop()
