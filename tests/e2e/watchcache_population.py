"""The objects the watch-cache differential tests list, and the kproxy that caches them.

Three namespaces (named so that storage-key order differs from (namespace, name) order) of bare
pods (never scheduled: there is no scheduler or kubelet), configmaps and secrets with varied labels
(keys missing on some), field values (``spec.nodeName`` set on some, ``restartPolicy``,
``schedulerName``, ``serviceAccountName``, ``hostNetwork``, ``status.phase``) and secret types,
created in an order unlike their names' so that list order is tested; plus objects that catch
encoders and stores out (see ``_special``).

``KPROXY_WATCHCACHE_DIFF_PASSTHROUGH=1`` starts kproxy without the filter (a pure pass-through,
which must agree with the apiserver trivially): a way to debug the harness itself. The
"served from cache" assertions then fail, as they should.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from corpus.compare import Answer, Sides

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

PASSTHROUGH_ENV = "KPROXY_WATCHCACHE_DIFF_PASSTHROUGH"
CACHED = ("pods", "configmaps", "secrets")
PODS, CONFIGMAPS = 60, 40
POD_SPLIT = (25, 20, 15)
CM_SPLIT = (16, 14, 10)


@dataclass
class Population:
    namespaces: list[str]
    pods: dict[str, list[str]]  # namespace -> names
    configmaps: dict[str, list[str]]
    secrets: dict[str, list[str]]
    #: A list resourceVersion taken before anything was created (an "old N").
    old_rv: int
    #: A list resourceVersion taken after everything was created (a "recent N").
    recent_rv: int


def _name(prefix: str, i: int, n: int) -> str:
    """Names in an order unlike creation order: 37 is coprime to every n used here."""
    return f"{prefix}-{(i * 37) % n:02d}"


def _pod(ns: str, i: int) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if i % 5 != 0:
        labels["app"] = ("web", "db", "cache", "queue")[i % 4]
    if i % 3 == 0:
        labels["tier"] = ("front", "back")[i % 2]
    if i % 4 == 1:
        labels["env"] = "prod" if i % 8 == 1 else "dev"
    if i % 7 == 0:
        labels = {}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": f"registry.example/app:{i % 3}"}],
        "restartPolicy": ("Always", "OnFailure", "Never")[i % 3],
        "schedulerName": "default-scheduler" if i % 2 else "batch-scheduler",
        "serviceAccountName": ("default", "builder", "runner")[(i // 3) % 3],
    }
    if i % 4 in (1, 2):
        spec["nodeName"] = ("node-a", "node-b")[i % 2]
    if i % 9 == 0:
        spec["hostNetwork"] = True
    meta: dict[str, Any] = {"name": _name("pod", i, PODS), "namespace": ns}
    if labels:
        meta["labels"] = labels
    if i % 6 == 0:
        meta["annotations"] = {"example.com/note": f"pod {i}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _pod_status(i: int) -> dict[str, Any] | None:
    """A status for some of the pods (as a kubelet would write it), so status.phase varies."""
    if i % 4 == 1:
        ip = f"10.1.{i // 200}.{i % 200 + 1}"
        return {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "192.168.0.1"}
    if i % 4 == 2:
        return {"phase": "Succeeded" if i % 8 == 2 else "Failed"}
    return None


def _configmap(ns: str, i: int) -> dict[str, Any]:
    labels = {"team": ("red", "blue", "green")[i % 3]}
    if i % 2:
        labels["app"] = ("web", "db")[i % 4 // 2]
    if i % 10 == 0:
        labels = {}
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": _name("cm", i, CONFIGMAPS), "namespace": ns, "labels": labels},
        "data": {f"key{j}": f'value {i}.{j} ünïcode "quoted" \n' for j in range(i % 4 + 1)},
    }
    if i % 5 == 0:
        cm["binaryData"] = {"blob": base64.b64encode(bytes(range(i, i + 16))).decode()}
    if i % 8 == 0:
        cm["immutable"] = True
    return cm


def _secrets(ns: str, k: int) -> list[dict[str, Any]]:
    """Secrets of four types; each namespace gets a few of each."""

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    def secret(name: str, type_: str, data: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": ns}
        if labels:
            meta["labels"] = labels
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": type_, "data": data}

    out = [secret(f"opaque-{j}", "Opaque", {"token": b64(f"t{k}{j}")}, {"kind": "opaque"}) for j in range(3)]
    out += [
        secret(f"tls-{j}", "kubernetes.io/tls", {"tls.crt": b64("crt"), "tls.key": b64("key")}, {"kind": "tls"})
        for j in range(2)
    ]
    out.append(secret("registry", "kubernetes.io/dockerconfigjson", {".dockerconfigjson": b64('{"auths":{}}')}, {}))
    out.append(secret("basic", "kubernetes.io/basic-auth", {"username": b64("u"), "password": b64("p")}, {}))
    return out


def _special(ns: str) -> list[dict[str, Any]]:
    """Objects that catch encoders and stores out.

    Go's JSON escapes <, >, & and U+2028/U+2029 as \\u003c...; a large value; a label key with a
    prefix; objects deleted right after creation; one kept terminating by its finalizer."""
    tricky = {
        "html": "<b>Tom & Jerry</b> -> ok",
        "separators": "line\u2028para\u2029end",
        "control": "tab\tbell\u0007nul-free",
        "emoji": "caf\u00e9 \U0001f600",
    }
    # Scalars whose YAML style (plain, quoted, literal, folded at width 80) go-yaml decides by rules
    # of its own; keys included ("y", "on" and numbers are quoted as keys too).
    yamlish = [
        "yes",
        "no",
        "on",
        "off",
        "y",
        "n",
        "true",
        "False",
        "null",
        "~",
        "",
        " ",
        "1e3",
        "0x10",
        "012",
        "1_000",
        "3.",
        ".5",
        "-",
        "- item",
        "key: value",
        "#comment",
        "a #b",
        "@at",
        "`tick",
        "%pct",
        "!bang",
        "&anchor",
        "*alias",
        "|pipe",
        ">gt",
        "'quote",
        '"dq',
        "{brace",
        "[bracket",
        "tab\there",
        " leading",
        "trailing ",
        "multi\nline\n",
        "multi\nline no newline",
        "crlf\r\nline",
        "日本\u2028",
        "\u00a0nbsp",
        "2001-01-01",
        "x" * 100,
        "word " * 30,
        "0o17",
        "+1",
        ".inf",
        "-.Inf",
        ".NaN",
        "=",
        "<<",
        "?q",
        "a: b: c",
    ]
    yaml_cm = {f"k{i:02d}": v for i, v in enumerate(yamlish)}
    yaml_cm.update(
        {
            "y": "key y",
            "on": "key on",
            "1": "key 1",
            "true": "key true",
            "-dash": "key -dash",
            "_u": "key _u",
            "a.b": "key a.b",
        }
    )
    big = "".join(f"line {i:05d} of a large value\n" for i in range(4_000))  # ~120 KB
    cm = {"apiVersion": "v1", "kind": "ConfigMap"}
    return [
        {
            **cm,
            "metadata": {"name": "tricky", "namespace": ns, "labels": {"example.com/role": "tricky"}},
            "data": tricky,
        },
        {**cm, "metadata": {"name": "big", "namespace": ns, "labels": {"size": "big"}}, "data": {"big": big}},
        {**cm, "metadata": {"name": "yaml-styles", "namespace": ns}, "data": yaml_cm},
        {**cm, "metadata": {"name": "doomed-cm", "namespace": ns}},
        {
            **cm,
            "metadata": {"name": "terminating", "namespace": ns, "finalizers": ["example.com/keep"]},
            "data": {"state": "terminating"},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "doomed-pod", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "registry.example/app:0"}]},
        },
    ]


class _Admin:
    """Straight to the apiserver as admin, many requests at once (population is not under test)."""

    def __init__(self, cp: ControlPlaneInfo) -> None:
        self.cp = cp
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=cp.ssl_context(), limit=8))

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "Content-Type": content_type}
        async with self.session.request(method, self.cp.server + path, data=data, headers=headers) as resp:
            text = await resp.read()
            if resp.status not in ok:
                raise AssertionError(f"{method} {path}: HTTP {resp.status}: {text[:300]!r}")
            return json.loads(text) if text else None

    async def list_rv(self, path: str) -> int:
        return int((await self.call("GET", path))["metadata"]["resourceVersion"])

    async def close(self) -> None:
        await self.session.close()


def _collection(obj: dict[str, Any]) -> str:
    kind = {"Pod": "pods", "ConfigMap": "configmaps", "Secret": "secrets"}[obj["kind"]]
    return f"/api/v1/namespaces/{obj['metadata']['namespace']}/{kind}"


async def populate(cp: ControlPlaneInfo) -> Population:
    """Create everything (many at once, so in no particular order), delete a few, give some pods a status."""
    admin = _Admin(cp)
    try:
        return await _populate(admin)
    finally:
        await admin.close()


async def _populate(admin: _Admin) -> Population:
    old_rv = await admin.list_rv("/api/v1/pods?limit=1")
    suffix = secrets.token_hex(3)
    # Storage keys sort "<ns>/<name>" bytewise: "base-b/" < "base/" < "base0/" ('-' < '/' < '0'),
    # unlike sorting (namespace, name) pairs, which puts "base" first.
    base = f"wcdiff-{suffix}"
    namespaces = [base, f"{base}-b", f"{base}0"]
    for ns in namespaces:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"wcdiff": suffix}}}
        await admin.call("POST", "/api/v1/namespaces", body)
    objects: list[dict[str, Any]] = []
    pods: dict[str, list[str]] = {ns: [] for ns in namespaces}
    statuses: list[tuple[str, str, dict[str, Any]]] = []
    i = 0
    for ns, count in zip(namespaces, POD_SPLIT, strict=True):
        for _ in range(count):
            pod = _pod(ns, i)
            objects.append(pod)
            pods[ns].append(pod["metadata"]["name"])
            status = _pod_status(i)
            if status:
                statuses.append((ns, pod["metadata"]["name"], status))
            i += 1
    cms: dict[str, list[str]] = {ns: [] for ns in namespaces}
    i = 0
    for ns, count in zip(namespaces, CM_SPLIT, strict=True):
        for _ in range(count):
            cm = _configmap(ns, i)
            objects.append(cm)
            cms[ns].append(cm["metadata"]["name"])
            i += 1
    secs: dict[str, list[str]] = {}
    for k, ns in enumerate(namespaces):
        # The last namespace has no secrets: its secret list is the empty one.
        items = _secrets(ns, k) if k < 2 else []
        objects.extend(items)
        secs[ns] = [s["metadata"]["name"] for s in items]
    objects += _special(namespaces[1])
    await asyncio.gather(*(admin.call("POST", _collection(o), o) for o in objects))
    for kind, name in (("configmaps", "doomed-cm"), ("pods", "doomed-pod"), ("configmaps", "terminating")):
        # Deleted for good (the cache sees DELETED), or left terminating behind its finalizer.
        await admin.call("DELETE", f"/api/v1/namespaces/{namespaces[1]}/{kind}/{name}")
    await asyncio.gather(
        *(
            admin.call(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                {"status": status},
                "application/merge-patch+json",
            )
            for ns, name, status in statuses
        )
    )
    recent_rv = await admin.list_rv("/api/v1/pods?limit=1")
    return Population(namespaces, pods, cms, secs, old_rv, recent_rv)


async def depopulate(cp: ControlPlaneInfo, pop: Population) -> None:
    """Delete what was created (pods forced: with a nodeName and no kubelet they would linger)."""
    admin = _Admin(cp)
    anything = tuple(range(200, 600))
    try:
        b = pop.namespaces[1]
        patch = {"metadata": {"finalizers": None}}
        await admin.call(
            "PATCH", f"/api/v1/namespaces/{b}/configmaps/terminating", patch, "application/merge-patch+json", anything
        )
        for ns in pop.namespaces:
            await admin.call("DELETE", f"/api/v1/namespaces/{ns}/pods", {"gracePeriodSeconds": 0}, ok=anything)
            for kind in ("configmaps", "secrets"):
                await admin.call("DELETE", f"/api/v1/namespaces/{ns}/{kind}", ok=anything)
            await admin.call("DELETE", f"/api/v1/namespaces/{ns}", ok=anything)
    finally:
        await admin.close()


def filters() -> list[dict[str, Any]]:
    if os.environ.get(PASSTHROUGH_ENV) == "1":
        return []
    return [{"name": "watchcache", "resources": list(CACHED)}]


def start_cache_proxy(tmp: Path, cp: ControlPlaneInfo) -> RunningProxy:
    """kproxy (credentials: proxy) with the watch cache on pods, configmaps and secrets."""
    return start_proxy(tmp, cp.admin_kubeconfig, extra={"filters": filters()})


# --------------------------------------------------------------------------- module-scoped fixtures


@pytest.fixture(scope="module")
def cache_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_cache_proxy(tmp_path_factory.mktemp("kproxy-watchcache"), control_plane)
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
async def population(control_plane: ControlPlaneInfo, cache_proxy: RunningProxy) -> AsyncIterator[Population]:
    """Created after kproxy started, so the cache learns it from its watch, not its first list."""
    pop = await populate(control_plane)
    yield pop
    await depopulate(control_plane, pop)


@pytest.fixture(scope="module")
async def wc_sides(
    control_plane: ControlPlaneInfo, cache_proxy: RunningProxy, population: Population
) -> AsyncIterator[Sides]:
    """Direct and through-kproxy sessions, once the cache has caught up with the population."""
    s = Sides(control_plane, cache_proxy.url)
    await settle(s)
    yield s
    await s.close()


async def settle(sides: Sides, deadline_s: float = 20.0, paths: list[str] | None = None) -> None:
    """Wait (bounded) until kproxy's resourceVersion=0 lists name what the apiserver's do.

    A list with resourceVersion=0 may be stale by design; the comparisons need both caches to have
    caught up with the population. Not reaching it is left to the tests to report, item by item.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    pending = [f"{p}?resourceVersion=0" for p in paths or [f"/api/v1/{r}" for r in CACHED]]
    while pending and loop.time() < end:
        still: list[str] = []
        for path in pending:
            direct, proxied = await sides.both("GET", path)
            if direct.status != 200 or proxied.status != 200 or _names(direct.body) != _names(proxied.body):
                still.append(path)
        pending = still
        if pending:
            await asyncio.sleep(0.1)


def _names(body: bytes) -> list[tuple[str, str]]:
    try:
        items = json.loads(body).get("items") or []
    except ValueError:
        return []
    return [(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items]


# --------------------------------------------------------------------------- credentials: forward


class BearerSides(Sides):
    """Both sides authenticated by a bearer token only (no client certificate), as a caller of a
    `credentials: forward` kproxy is: kproxy forwards it upstream and authorizes cached reads with it."""

    def __init__(self, cp: ControlPlaneInfo, rp: RunningProxy, token: str) -> None:
        super().__init__(cp, rp.url)
        self.token = token
        assert rp.ca_file is not None
        proxy_tls = ssl.create_default_context(cafile=str(rp.ca_file))
        skip = ("Accept", "Accept-Encoding", "User-Agent")
        self._direct_bearer = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context(client_cert=False)),
            auto_decompress=False,
            skip_auto_headers=skip,
        )
        self._proxy_bearer = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=proxy_tls), auto_decompress=False, skip_auto_headers=skip
        )

    def session(self, via_proxy: bool) -> aiohttp.ClientSession:
        return self._proxy_bearer if via_proxy else self._direct_bearer

    async def request(self, method: str, path: str, *, via_proxy: bool, **kw: Any) -> Answer:
        headers = {"Authorization": f"Bearer {self.token}", **(kw.pop("headers", None) or {})}
        return await super().request(method, path, via_proxy=via_proxy, headers=headers, **kw)

    async def close(self) -> None:
        await self._direct_bearer.close()
        await self._proxy_bearer.close()
        await super().close()


@pytest.fixture(scope="module")
def forward_cache_proxy(
    control_plane: ControlPlaneInfo, population: Population, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """The same cache behind `credentials: forward` (TLS, as kubectl sends tokens only over TLS)."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-watchcache-fwd"),
        control_plane.admin_kubeconfig,
        credentials="forward",
        tls=True,
        extra={"filters": filters()},
    )
    yield rp
    rp.stop()
