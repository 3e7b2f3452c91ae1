"""Watches served from the watch cache against the apiserver's own.

Each test opens the same watch requests straight on the apiserver and through kproxy (watch cache
on pods, configmaps, nodes and a custom resource) at the same moment, while a writer creates,
relabels (so that selectors flip), changes the status of, and deletes objects; then compares the
two streams event by event (types, parsed objects, frame bytes; see :mod:`watchcache_watchdiff`
for what may differ) and checks that kproxy served them from its cache
(``kproxy_watchcache_reads_total{verb="watch",served="cache"}``). A recorder watch predicts what
each request must deliver, so every wait ends on an event, not a sleep.

Covered: every resourceVersion form (unset, 0, N from the history, N just ahead, N older than
the window -> 410, a future N -> 504 or waiting), sendInitialEvents true/false, bookmarks and the
initial-events-end marker, timeoutSeconds and the default timeout, every selector operator and
field selectors with their transitions, namespace-scoped, cluster-wide and cluster-scoped, JSON,
protobuf and client-go's Accept, gzip of watch-list streams, other spellings of the same request,
what passes through (invalid options, 406s, impersonation), `credentials: forward`, watches
opened while writers run (also over a large initial state), 24 watchers through a burst, and
(last, as it restarts the apiserver) watches kept open through an upstream relist.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from corpus.compare import JSON, PROTOBUF, YAML
from watchcache_diff import Mismatches, diff, gather_limited, query_path
from watchcache_watchdiff import (
    PB_CLIENT_GO,
    PB_WATCH,
    BearerWatchSides,
    Event,
    Opened,
    Res,
    Scenario,
    Spec,
    WatchSides,
    WatchStream,
    Writer,
    as_expected,
    caught_up,
    check_order,
    compare_bookmarks,
    compare_error_events,
    compare_streams,
    error_numbers,
    labels,
    local_state,
    periodic_bookmarks,
    upstream_reasons,
    watch_reads,
)

from kproxy.localcluster.controlplane import USER_NAME
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.proxyproc import RunningProxy, start_proxy

GROUP = "wcwatch.example.com"
PLURAL = "gizmos"
PODS = Res("pods", "/api/v1", "pods", "Pod")
CONFIGMAPS = Res("configmaps", "/api/v1", "configmaps", "ConfigMap")
GIZMOS = Res(f"{PLURAL}.{GROUP}", f"/apis/{GROUP}/v1", PLURAL, "Gizmo")
NODES = Res("nodes", "/api/v1", "nodes", "Node")
GIZMO_CRD = crds.crd(
    GROUP, PLURAL, "Gizmo", spec_fields={"color": "string", "size": "integer"}, selectable=[".spec.color"]
)
CACHED = ["pods", "configmaps", "nodes", f"{GROUP}/v1/{PLURAL}"]
FUTURE = 10**9  # a resourceVersion the test cluster never reaches


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def watch_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy caching pods, configmaps, nodes and the gizmos (started once the CRD is served)."""
    crds.install(control_plane, GIZMO_CRD)
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-watchdiff"),
        control_plane.admin_kubeconfig,
        extra={"filters": [{"name": "watchcache", "resources": CACHED}]},
    )
    yield rp
    rp.stop()
    crds.uninstall(control_plane, GIZMO_CRD["metadata"]["name"])


@pytest.fixture
async def ws(control_plane: ControlPlaneInfo, watch_proxy: RunningProxy) -> AsyncIterator[WatchSides]:
    sides = WatchSides(control_plane, watch_proxy.url)
    yield sides
    await sides.close()


@pytest.fixture
async def spaces(control_plane: ControlPlaneInfo, ws: WatchSides) -> AsyncIterator[tuple[str, str]]:
    """Two fresh namespaces (the second one's events must not reach a watch of the first);
    what the test made in them is deleted afterwards."""
    base = f"wdiff-{secrets.token_hex(3)}"
    names = (base, f"{base}-o")
    for ns in names:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        status, out = control_plane.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
        assert status == 201, out
    yield names
    for ns in names:
        for res in (PODS, CONFIGMAPS, GIZMOS):
            await ws.request(
                "DELETE",
                f"{res.path(ns)}?gracePeriodSeconds=0",
                via_proxy=False,
                data=b"{}",
                headers={"Content-Type": "application/json"},
            )
        control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


# --------------------------------------------------------------------------- objects and selectors


def pod(name: str, lbls: Mapping[str, str], node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(lbls)}, "spec": spec}


def configmap(name: str, lbls: Mapping[str, str], data: Mapping[str, str]) -> dict[str, Any]:
    meta = {"name": name, "labels": dict(lbls)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}


def gizmo(name: str, lbls: Mapping[str, str], color: str, size: int) -> dict[str, Any]:
    meta = {"name": name, "labels": dict(lbls)}
    return {"apiVersion": f"{GROUP}/v1", "kind": "Gizmo", "metadata": meta, "spec": {"color": color, "size": size}}


def relabel(**changes: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": changes}}


def phase_patch(phase: str) -> dict[str, Any]:
    return {"status": {"phase": phase}}


Obj = Mapping[str, Any]


def _ns(o: Obj) -> str:
    return str((o.get("metadata") or {}).get("namespace", ""))


def _name(o: Obj) -> str:
    return str((o.get("metadata") or {}).get("name", ""))


def _phase(o: Obj) -> str | None:
    return (o.get("status") or {}).get("phase")


def _color(o: Obj) -> str | None:
    return (o.get("spec") or {}).get("color")


@dataclass(frozen=True)
class Sel:
    """A selector as sent (label and field selector) and the same selector in Python."""

    name: str
    label: str | None
    field: str | None
    test: Callable[[Obj], bool]

    def params(self) -> list[tuple[str, str]]:
        out = []
        if self.label is not None:
            out.append(("labelSelector", self.label))
        if self.field is not None:
            out.append(("fieldSelector", self.field))
        return out


EVERYTHING = Sel("all", None, None, lambda o: True)
POD_SELECTORS = [
    Sel("app=web", "app=web", None, lambda o: labels(o).get("app") == "web"),
    Sel(
        "app in (web,db),!tier",
        "app in (web,db),!tier",
        None,
        lambda o: labels(o).get("app") in ("web", "db") and "tier" not in labels(o),
    ),
    Sel("env!=prod", "env!=prod", None, lambda o: labels(o).get("env") != "prod"),
    Sel("phase=Running", None, "status.phase=Running", lambda o: _phase(o) == "Running"),
    Sel(
        "phase!=Running,name!=p-a4",
        None,
        "status.phase!=Running,metadata.name!=p-a4",
        lambda o: _phase(o) != "Running" and _name(o) != "p-a4",
    ),
    Sel(
        "app=web + phase=Running",
        "app=web",
        "status.phase=Running",
        lambda o: labels(o).get("app") == "web" and _phase(o) == "Running",
    ),
    Sel("nodeName=node-a", None, "spec.nodeName=node-a", lambda o: (o.get("spec") or {}).get("nodeName") == "node-a"),
    Sel("name=p-a1", None, "metadata.name=p-a1", lambda o: _name(o) == "p-a1"),
]


def rv_forms(n: int) -> dict[str, list[tuple[str, str]]]:
    """Every resourceVersion form of a watch (docs/developing/wire-reference.md#watch-resourceversion);
    ``n`` is a recent resourceVersion."""
    sie = [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
    nosie = [("sendInitialEvents", "false"), ("resourceVersionMatch", "NotOlderThan")]
    bm = [("allowWatchBookmarks", "true")]
    rv_n = [("resourceVersion", str(n))]
    rv_0 = [("resourceVersion", "0")]
    return {
        "unset": [],
        "0": rv_0,
        "N": rv_n,
        "unset+bm": bm,
        "0+bm": rv_0 + bm,
        "N+bm": rv_n + bm,
        "sie": sie,
        "sie+bm": sie + bm,
        "sie+0+bm": sie + rv_0 + bm,
        "sie+N+bm": sie + rv_n + bm,
        "nosie": nosie,
        "nosie+bm": nosie + bm,
        "nosie+N": nosie + rv_n,
    }


def make_spec(res: Res, ns: str | None, form: str, params: list[tuple[str, str]], sel: Sel, accept: str = JSON) -> Spec:
    def matches(o: Obj) -> bool:
        return (ns is None or _ns(o) == ns) and bool(sel.test(o))

    where = ns or "cluster"
    label = f"{res.label} {where} rv={form} sel={sel.name}"
    return Spec(label, res, ns, tuple(params + sel.params()), matches, accept)


async def run_waves(
    sc: Scenario,
    w: Writer,
    rp: RunningProxy,
    wave1: list[Spec],
    phase1: Callable[[], Awaitable[int]],
    wave2_for: Callable[[int], list[Spec]],
    phase2: Callable[[], Awaitable[None]],
) -> tuple[Mismatches, list[Opened]]:
    """wave 1 opened; phase 1 written; wave 2 (built from phase 1's resourceVersions) opened;
    phase 2 written; everything compared."""
    before = watch_reads(rp, sc.res.label)
    opened = await sc.open(wave1)
    mid = await phase1()
    await sc.seen(w.last_rv)
    await sc.proxy_caught_up(60)
    opened += await sc.open(wave2_for(mid))
    await phase2()
    await sc.seen(w.last_rv)
    found = await sc.finish()
    assert sc.compared >= 2 * len(opened), f"harness: only {sc.compared} events over {len(opened)} watches"
    print(f"{sc.res.label}: {len(opened)} watch pairs, {sc.compared} events from the apiserver compared")
    served = watch_reads(rp, sc.res.label) - before
    want = sum(1 for o in opened if o.direct.status == 200)
    if served != want:
        found.add(
            f"{sc.res.label}: watches served from the cache",
            f"kproxy_watchcache_reads_total{{verb=watch,served=cache}} grew by {served}; upstream reasons "
            f"{upstream_reasons(rp, sc.res.label)}",
            want,
            served,
        )
    return found, opened


# --------------------------------------------------------------------------- pods


async def test_watch_pods_every_form(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """Pods, JSON and protobuf, namespace-scoped and cluster-wide, every resourceVersion form (unset,
    0, a recent N, sendInitialEvents true/false + NotOlderThan, with and without bookmarks),
    label and field selectors whose matches flip (labels changed, status.phase changed, objects
    deleted and created again); a second wave starts from the middle of the history."""
    a, b = spaces
    w = Writer(ws)
    # The state before any watch: initial events are made of these.
    for name, lbls, node in [
        ("p-a0", {"app": "web", "tier": "front"}, None),
        ("p-a1", {"app": "db"}, None),
        ("p-a2", {"app": "web", "env": "prod"}, "node-a"),
        ("p-a3", {}, None),
        ("p-a4", {"app": "cache", "tier": "back"}, "node-a"),
    ]:
        await w.create(PODS, a, pod(name, lbls, node))
    await w.create(PODS, b, pod("p-b0", {"app": "web"}))
    await w.create(PODS, b, pod("p-b1", {"app": "db"}))
    await w.patch(PODS, a, "p-a1", phase_patch("Running"), status=True)

    sc = Scenario(ws, PODS)
    await sc.start()
    assert sc.oracle is not None
    n0 = sc.oracle.list_rv
    forms = rv_forms(n0)
    wave1 = [make_spec(PODS, a, f, p, EVERYTHING) for f, p in forms.items()]
    wave1 += [make_spec(PODS, None, f, forms[f], EVERYTHING) for f in ("unset", "N", "sie+bm", "nosie")]
    for i, sel in enumerate(POD_SELECTORS):
        for f in (("unset", "N+bm"), ("sie+bm", "0"), ("unset+bm", "N"), ("nosie", "sie"))[i % 4]:
            wave1.append(make_spec(PODS, a, f, forms[f], sel))
    wave1 += [make_spec(PODS, None, "unset", forms["unset"], POD_SELECTORS[0])]
    wave1 += [make_spec(PODS, None, "N", forms["N"], POD_SELECTORS[3])]
    # A namespace that does not exist (a watch does not check): nothing but bookmarks.
    wave1 += [make_spec(PODS, f"{a}-none", f, forms[f], EVERYTHING) for f in ("unset+bm", "N", "sie+bm")]
    # A resourceVersion a little ahead of the cache: the watch waits for it, then goes on.
    ahead = rv_forms(n0 + 4)
    wave1 += [
        make_spec(PODS, a, "N+4", ahead["N"], EVERYTHING),
        make_spec(PODS, None, "N+4", ahead["N"], EVERYTHING, PB_WATCH),
    ]
    wave1 += [make_spec(PODS, a, f, forms[f], EVERYTHING, PB_WATCH) for f in ("unset", "sie+bm", "N", "nosie")]
    wave1 += [
        make_spec(PODS, a, "unset", forms["unset"], POD_SELECTORS[0], PB_WATCH),
        make_spec(PODS, None, "unset+bm", forms["unset+bm"], POD_SELECTORS[3], PB_WATCH),
        make_spec(PODS, a, "unset", forms["unset"], POD_SELECTORS[1], PB_CLIENT_GO),
        make_spec(PODS, a, "0", forms["0"], EVERYTHING, PB_CLIENT_GO),
    ]

    async def phase1() -> int:
        await w.create(PODS, a, pod("p-a5", {"app": "web"}))
        await w.patch(PODS, a, "p-a1", relabel(app="web"))
        await w.patch(PODS, a, "p-a0", phase_patch("Running"), status=True)
        mid = await w.patch(PODS, b, "p-b0", relabel(app="db"))
        await w.delete(PODS, a, "p-a3")
        await w.patch(PODS, a, "p-a2", relabel(env="dev"))
        await w.create(PODS, a, pod("p-a6", {"app": "db", "tier": "front"}))
        await w.patch(PODS, a, "p-a4", {"metadata": {"annotations": {"note": "touched"}}})
        assert mid is not None
        return mid

    def wave2(mid: int) -> list[Spec]:
        f2 = rv_forms(mid)
        out = [make_spec(PODS, a, f"{f}(mid)", f2[f], EVERYTHING) for f in ("N", "0", "unset", "sie+bm", "nosie+N")]
        out += [make_spec(PODS, a, "N(mid)", f2["N"], POD_SELECTORS[i]) for i in (0, 2, 3, 4)]
        out += [make_spec(PODS, None, "N(mid)", f2["N"], EVERYTHING)]
        out += [make_spec(PODS, a, "N(mid)", f2["N"], s, PB_WATCH) for s in (EVERYTHING, POD_SELECTORS[4])]
        return out

    async def phase2() -> None:
        await w.patch(PODS, a, "p-a0", relabel(app=None))
        await w.patch(PODS, a, "p-a1", phase_patch("Succeeded"), status=True)
        await w.delete(PODS, a, "p-a5")
        await w.create(PODS, a, pod("p-a3", {"app": "web"}))
        await w.patch(PODS, a, "p-a6", phase_patch("Running"), status=True)
        await w.patch(PODS, a, "p-a2", relabel(app="db"))
        await w.create(PODS, b, pod("p-b2", {"app": "web"}))
        await w.delete(PODS, a, "p-a2", graceful=True)  # bound to node-a: only marked for deletion
        await w.patch(PODS, a, "p-a4", relabel(app="web"))
        await w.delete(PODS, a, "p-a2")

    try:
        found, _ = await run_waves(sc, w, watch_proxy, wave1, phase1, wave2, phase2)
    finally:
        await sc.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- configmaps


async def test_watch_configmaps_every_form(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """ConfigMaps: the resourceVersion forms, label selectors that flip, metadata.name and
    metadata.namespace field selectors, JSON and protobuf, namespace-scoped and cluster-wide."""
    a, b = spaces
    w = Writer(ws)
    for i in range(6):
        lbls = {"team": ("red", "blue", "green")[i % 3]}
        if i % 2:
            lbls["app"] = "web"
        await w.create(CONFIGMAPS, a if i < 4 else b, configmap(f"cm-{i}", lbls, {"k": f"v{i} <&> \u2028"}))
    sc = Scenario(ws, CONFIGMAPS)
    await sc.start()
    assert sc.oracle is not None
    forms = rv_forms(sc.oracle.list_rv)
    sels = [
        Sel("team=red", "team=red", None, lambda o: labels(o).get("team") == "red"),
        Sel("team!=red,app", "team!=red,app", None, lambda o: labels(o).get("team") != "red" and "app" in labels(o)),
        Sel("name=cm-1", None, "metadata.name=cm-1", lambda o: _name(o) == "cm-1"),
        Sel("name!=cm-2", None, "metadata.name!=cm-2", lambda o: _name(o) != "cm-2"),
    ]
    ns_sel = Sel(f"namespace={a}", None, f"metadata.namespace={a}", lambda o: _ns(o) == a)
    wave1 = [make_spec(CONFIGMAPS, a, f, forms[f], EVERYTHING) for f in ("unset", "0", "N", "sie+bm", "nosie", "0+bm")]
    wave1 += [make_spec(CONFIGMAPS, a, f, forms[f], s) for s in sels for f in ("unset+bm", "N")]
    wave1 += [make_spec(CONFIGMAPS, None, f, forms[f], ns_sel) for f in ("unset", "N")]
    wave1 += [make_spec(CONFIGMAPS, None, "sie+bm", forms["sie+bm"], sels[0])]
    wave1 += [make_spec(CONFIGMAPS, a, f, forms[f], EVERYTHING, PB_WATCH) for f in ("unset+bm", "N")]
    wave1 += [make_spec(CONFIGMAPS, None, "N", forms["N"], sels[1], PB_CLIENT_GO)]

    async def phase1() -> int:
        await w.patch(CONFIGMAPS, a, "cm-0", relabel(team="blue", app="web"))
        mid = await w.patch(CONFIGMAPS, a, "cm-1", {"data": {"k": "changed"}})
        await w.delete(CONFIGMAPS, a, "cm-2")
        await w.patch(CONFIGMAPS, b, "cm-4", relabel(team="red"))
        await w.create(CONFIGMAPS, a, configmap("cm-6", {"team": "red"}, {"k": "new"}))
        assert mid is not None
        return mid

    def wave2(mid: int) -> list[Spec]:
        f2 = rv_forms(mid)
        out = [make_spec(CONFIGMAPS, a, f"{f}(mid)", f2[f], EVERYTHING) for f in ("N", "sie+N+bm", "nosie+N")]
        out += [make_spec(CONFIGMAPS, a, "N(mid)", f2["N"], s) for s in sels[:2]]
        out += [make_spec(CONFIGMAPS, None, "N(mid)", f2["N"], ns_sel, PB_WATCH)]
        return out

    async def phase2() -> None:
        kept = configmap("cm-kept", {"team": "red"}, {"k": "v"})
        kept["metadata"]["finalizers"] = ["example.com/keep"]
        await w.create(CONFIGMAPS, a, kept)
        await w.delete(CONFIGMAPS, a, "cm-kept")  # MODIFIED: deletionTimestamp set, kept by its finalizer
        big = "".join(f"line {i:06d} <&> of a large value \u2028\n" for i in range(20_000))  # ~700 KB
        await w.create(CONFIGMAPS, a, configmap("cm-big", {"team": "red"}, {"big": big}))
        await w.patch(CONFIGMAPS, a, "cm-big", {"data": {"big": big[::-1]}})
        await w.patch(CONFIGMAPS, a, "cm-kept", {"metadata": {"finalizers": None}})  # DELETED
        await w.create(CONFIGMAPS, a, configmap("cm-2", {"team": "red", "app": "db"}, {"k": "again"}))
        await w.patch(CONFIGMAPS, a, "cm-1", relabel(app=None))
        await w.patch(CONFIGMAPS, a, "cm-3", relabel(team="red"))
        await w.delete(CONFIGMAPS, b, "cm-5")
        await w.patch(CONFIGMAPS, a, "cm-6", relabel(app="web", team="green"))

    try:
        found, _ = await run_waves(sc, w, watch_proxy, wave1, phase1, wave2, phase2)
    finally:
        await sc.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- a custom resource


async def test_watch_custom_resource(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """A custom resource (JSON only: unstructured objects, sorted keys), its selectable field
    spec.color flipping, label selectors; client-go's protobuf-then-JSON Accept gets JSON."""
    a, b = spaces
    w = Writer(ws)
    for i in range(5):
        color = ("red", "green", "blue")[i % 3]
        lbls = {"shape": "round"} if i % 2 else {}
        await w.create(GIZMOS, a if i < 4 else b, gizmo(f"g-{i}", lbls, color, i * 3))
    sc = Scenario(ws, GIZMOS)
    await sc.start()
    assert sc.oracle is not None
    forms = rv_forms(sc.oracle.list_rv)
    red = Sel("color=red", None, "spec.color=red", lambda o: _color(o) == "red")
    not_red = Sel("color!=red", None, "spec.color!=red", lambda o: _color(o) != "red")
    round_ = Sel("shape=round", "shape=round", None, lambda o: labels(o).get("shape") == "round")
    wave1 = [make_spec(GIZMOS, a, f, forms[f], EVERYTHING) for f in ("unset", "0", "N", "sie+bm", "nosie", "unset+bm")]
    wave1 += [make_spec(GIZMOS, a, f, forms[f], s) for s in (red, not_red, round_) for f in ("unset", "N+bm")]
    wave1 += [make_spec(GIZMOS, None, f, forms[f], red) for f in ("sie+bm", "N")]
    wave1 += [make_spec(GIZMOS, a, "unset", forms["unset"], EVERYTHING, PB_CLIENT_GO)]

    async def phase1() -> int:
        await w.patch(GIZMOS, a, "g-1", {"spec": {"color": "red"}})
        mid = await w.patch(GIZMOS, a, "g-0", {"spec": {"color": "blue", "size": 100}})
        await w.patch(GIZMOS, a, "g-2", relabel(shape="round"))
        await w.delete(GIZMOS, a, "g-3")
        assert mid is not None
        return mid

    def wave2(mid: int) -> list[Spec]:
        f2 = rv_forms(mid)
        return [make_spec(GIZMOS, a, "N(mid)", f2["N"], s) for s in (EVERYTHING, red, not_red)]

    async def phase2() -> None:
        await w.create(GIZMOS, a, gizmo("g-3", {"shape": "round"}, "red", 7))
        await w.patch(GIZMOS, a, "g-1", {"spec": {"color": "green"}})
        await w.patch(GIZMOS, b, "g-4", {"spec": {"color": "red"}})
        await w.patch(GIZMOS, a, "g-0", {"spec": {"color": "red"}})

    try:
        found, _ = await run_waves(sc, w, watch_proxy, wave1, phase1, wave2, phase2)
    finally:
        await sc.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- too old, too new


@pytest.fixture(scope="module")
def short_proxy(
    control_plane: ControlPlaneInfo, watch_proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy with a 2 s event history (a resourceVersion a few seconds old is already too old)
    and a 3 s minimum watch timeout (the default timeout is uniform in [3, 6) s)."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-watchdiff-short"),
        control_plane.admin_kubeconfig,
        extra={"filters": [{"name": "watchcache", "resources": CACHED, "history_window": 2, "min_request_timeout": 3}]},
    )
    yield rp
    rp.stop()


async def _only_error(stream: WatchStream, timeout: float = 30.0) -> Event | str:
    """A watch answered with 200 and exactly one ERROR event, then a clean end: that event, or
    what was wrong."""
    if stream.status != 200:
        return f"status {stream.status}: {stream.body[:300]!r}"
    if not await stream.wait_end(timeout):
        return f"the stream did not end after its ERROR event; events: {[e.short() for e in stream.events]}"
    if stream.failure:
        return stream.failure
    if [e.type for e in stream.events] != ["ERROR"]:
        return f"events {[e.short() for e in stream.events]}"
    return stream.events[0]


async def test_watch_too_old_resource_version(
    control_plane: ControlPlaneInfo, short_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """A resourceVersion older than kproxy's history window: 200, one ERROR event carrying a 410
    Expired Status "too old resource version: N (M)" (M: the oldest resourceVersion kproxy can
    still deliver from, minus one), then the stream ends; byte for byte the apiserver's own 410
    (the same request for a resourceVersion from before the custom resource existed, which the
    apiserver's watch cache does not reach either), JSON and protobuf."""
    a, _ = spaces
    sides = WatchSides(control_plane, short_proxy.url)
    streams: list[WatchStream] = []
    try:
        for res in (PODS, GIZMOS):
            await caught_up(sides, res)
        w = Writer(sides)
        old = await w.create(PODS, a, pod("p-old", {"app": "web"}))
        assert old is not None
        before = watch_reads(short_proxy, "pods")
        # Wait for kproxy's window to move past `old`: each round changes a pod (the history drops
        # what is older than the window as events come in) and asks again.
        loop = asyncio.get_running_loop()
        end, first = loop.time() + 60, None
        sent = 0
        while loop.time() < end:
            await w.patch(PODS, a, "p-old", {"metadata": {"annotations": {"round": str(sent)}}})
            probe = await sides.watch(
                PODS.path(a), [("resourceVersion", str(old)), ("timeoutSeconds", "1")], via_proxy=True
            )
            streams.append(probe)
            sent += 1
            await probe.wait_for(lambda s: bool(s.events), 5)
            first = probe.events[0] if probe.events else None
            if first is not None and first.type == "ERROR":
                break
        assert first is not None and first.type == "ERROR", f"kproxy never answered 410 for {old}: {first}"
        current = w.last_rv

        # The apiserver's own 410: a custom resource watched from before its definition existed.
        cr_direct, cr_proxied = await sides.pair(GIZMOS.path(a), [("resourceVersion", "1")])
        streams += [cr_direct, cr_proxied]
        pod_params = [("resourceVersion", str(old))]
        pod_direct = await sides.watch(PODS.path(a), [*pod_params, ("timeoutSeconds", "2")], via_proxy=False)
        pod_json = await sides.watch(PODS.path(a), pod_params, via_proxy=True)
        pod_pb = await sides.watch(PODS.path(a), pod_params, via_proxy=True, accept=PB_WATCH)
        pod_go = await sides.watch(PODS.path(None), pod_params, via_proxy=True, accept=PB_CLIENT_GO)
        streams += [pod_direct, pod_json, pod_pb, pod_go]
        sent += 3

        found = Mismatches()
        theirs = await _only_error(cr_direct)
        assert isinstance(theirs, Event), f"harness: the apiserver's custom resource watch from 1: {theirs}"
        assert theirs.obj.get("code") == 410 and theirs.obj.get("reason") == "Expired", theirs.obj
        cr = await _only_error(cr_proxied)
        if isinstance(cr, str):
            found.add("gizmos from resourceVersion 1", "kproxy's answer", "one ERROR event", cr)
        else:
            found.extend(compare_error_events("gizmos from resourceVersion 1", theirs, cr))
        for label, stream, ct in (
            ("pods JSON", pod_json, "application/json"),
            ("pods protobuf", pod_pb, PB_WATCH),
            ("pods cluster-wide, client-go Accept", pod_go, PB_WATCH),
        ):
            label = f"{label} from {old} (older than kproxy's 2 s window)"
            got = await _only_error(stream)
            if isinstance(got, str):
                found.add(label, "kproxy's answer", "200 + one ERROR event, then the end", got)
                continue
            if stream.headers.get("Content-Type") != ct:
                found.add(label, "Content-Type", ct, stream.headers.get("Content-Type"))
            found.extend(compare_error_events(label, theirs, got, same_request=False))
            numbers = error_numbers(got)
            if len(numbers) != 2 or numbers[0] != old or not old <= numbers[1] <= current:
                found.add(label, f"too old resource version: {old} (M) with {old} <= M <= {current}", "", numbers)
        # The apiserver's own window (75 s) still reaches `old`: it replays what came after.
        await pod_direct.wait_end(30)
        if pod_direct.status != 200 or not pod_direct.events or pod_direct.events[0].type != "MODIFIED":
            found.add(
                "harness", "the apiserver replaying from a recent resourceVersion", "MODIFIED...", pod_direct.events
            )
        served = watch_reads(short_proxy, "pods") - before
        if served != sent:
            found.add("pods watches served from the cache", upstream_reasons(short_proxy, "pods"), sent, served)
    finally:
        await asyncio.gather(*(s.close() for s in streams))
        await sides.close()
    assert not found, found.report()


async def test_watch_default_timeout(control_plane: ControlPlaneInfo, short_proxy: RunningProxy) -> None:
    """No timeoutSeconds: the watch ends cleanly after a random time in [min, 2 x min) (min 3 s
    here), without an ERROR event, as the apiserver's randomised default does."""
    sides = WatchSides(control_plane, short_proxy.url)
    try:
        await caught_up(sides, CONFIGMAPS)
        streams = await asyncio.gather(
            *(
                sides.watch(CONFIGMAPS.path("default"), params, via_proxy=True, accept=accept)
                for params in ([], [("resourceVersion", "0")], [("allowWatchBookmarks", "true")])
                for accept in (JSON, PB_WATCH)
            )
        )
        await asyncio.gather(*(s.wait_end(60) for s in streams))
        bad = []
        for s in streams:
            lasted = (s.ended_at or 0) - s.opened_at
            errors = [e for e in s.events if e.type == "ERROR"]
            if s.status != 200 or s.failure or s.ended_at is None or errors or not 2.9 <= lasted < 6 + 10:
                bad.append((s.label, s.status, s.failure, round(lasted, 2), [e.short() for e in errors]))
        await asyncio.gather(*(s.close() for s in streams))
    finally:
        await sides.close()
    assert not bad, bad


async def test_watch_future_resource_version(
    ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """A resourceVersion the cluster has not reached: with sendInitialEvents, 200 and one ERROR
    event (504 "Too large resource version", retry after 1 s) once the wait gives up; without, the
    watch just waits for it (no events) and ends at its timeout. JSON and protobuf."""
    a, _ = spaces
    for res in (PODS, GIZMOS):
        await caught_up(ws, res)
    sie = [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", str(FUTURE))]
    legacy = [("resourceVersion", str(FUTURE)), ("timeoutSeconds", "3")]
    requests = [
        (PODS, a, sie, JSON),
        (PODS, None, [*sie, ("allowWatchBookmarks", "true")], PB_WATCH),
        (GIZMOS, a, sie, JSON),
        (PODS, a, legacy, JSON),
        (PODS, a, legacy, PB_WATCH),
        (GIZMOS, None, legacy, JSON),
    ]
    pairs = await asyncio.gather(*(ws.pair(res.path(ns), p, accept=acc) for res, ns, p, acc in requests))
    found = Mismatches()
    try:
        await asyncio.gather(*(s.wait_end(60) for pair in pairs for s in pair))
        for (res, ns, params, accept), (direct, proxied) in zip(requests, pairs, strict=True):
            label = f"{res.label} {ns or 'cluster'} {params} [{accept}]"
            found.extend(compare_streams(label, direct, proxied, bookmarks_asked=True, initial=False))
            for who, s in (("apiserver", direct), ("kproxy", proxied)):
                if s.ended_at is None or s.failure:
                    found.add(label, f"{who}: a clean end", "ended", s.failure or "still open")
            if "sendInitialEvents" in dict(params):
                got = proxied.events[-1].obj if proxied.events else {}
                details = got.get("details") or {}
                if got.get("code") != 504 or details.get("retryAfterSeconds") != 1:
                    found.add(label, "504 ERROR with retryAfterSeconds 1", "", got)
    finally:
        await asyncio.gather(*(s.close() for pair in pairs for s in pair))
    assert not found, found.report()


# --------------------------------------------------------------------------- timeouts and bookmarks


async def test_watch_timeout_and_bookmarks(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """timeoutSeconds: both streams end cleanly after it (no ERROR event). allowWatchBookmarks:
    the bookmark the apiserver sends before a watch times out comes from kproxy too, with the
    same bytes (an empty object of the watched kind, only its resourceVersion set); without
    allowWatchBookmarks no bookmark at all."""
    a, _ = spaces
    w = Writer(ws)
    await w.create(PODS, a, pod("p-t0", {"app": "web"}))
    await w.create(CONFIGMAPS, a, configmap("cm-t0", {}, {"k": "v"}))
    await w.create(GIZMOS, a, gizmo("g-t0", {}, "red", 1))
    await w.patch(PODS, a, "p-t0", relabel(app="db"))
    for res in (PODS, CONFIGMAPS, GIZMOS):
        await caught_up(ws, res)
    n = w.last_rv - 1
    timeout = 4
    forms = {
        "N+bm": [("resourceVersion", str(n)), ("allowWatchBookmarks", "true")],
        "nosie+bm": [
            ("sendInitialEvents", "false"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "1"),
        ],
        "sie+bm": [
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "true"),
        ],
        "unset": [],
        "N": [("resourceVersion", str(n))],
    }
    requests = [(PODS, a, f, acc) for f in forms for acc in (JSON, PB_WATCH)]
    requests += [(CONFIGMAPS, a, "N+bm", JSON), (CONFIGMAPS, None, "N+bm", PB_WATCH), (GIZMOS, a, "N+bm", JSON)]
    pairs = await asyncio.gather(
        *(
            ws.pair(res.path(ns), [*forms[f], ("timeoutSeconds", str(timeout))], accept=acc)
            for res, ns, f, acc in requests
        )
    )
    found = Mismatches()
    compared_marks = 0
    try:
        await asyncio.gather(*(s.wait_end(timeout + 60) for pair in pairs for s in pair))
        for (res, ns, f, acc), (direct, proxied) in zip(requests, pairs, strict=True):
            label = f"{res.label} {ns or 'cluster'} rv={f} timeoutSeconds={timeout} [{acc}]"
            asked = "bm" in f
            found.extend(
                compare_streams(label, direct, proxied, bookmarks_asked=asked, initial=f in ("sie+bm", "unset"))
            )
            if asked:
                found.extend(compare_bookmarks(label, direct, proxied))
                compared_marks += len(periodic_bookmarks(direct))
            for who, s in (("apiserver", direct), ("kproxy", proxied)):
                lasted = (s.ended_at or 0) - s.opened_at
                if s.ended_at is None or s.failure or any(e.type == "ERROR" for e in s.events):
                    found.add(label, f"{who}: a clean end without an ERROR event", "", (s.failure, s.events[-1:]))
                elif not timeout - 0.5 <= lasted <= timeout + 30:
                    found.add(label, f"{who}: ended after {lasted:.2f} s", timeout, round(lasted, 2))
    finally:
        await asyncio.gather(*(s.close() for pair in pairs for s in pair))
    assert not found, found.report()
    assert compared_marks, "harness: the apiserver sent no bookmark before its watches timed out"


# --------------------------------------------------------------------------- what the cache does not serve


async def test_watch_invalid_options_and_media_types(
    ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """Invalid option combinations (the apiserver's 422/400/500), media types a watch cannot have
    (YAML, a protobuf watch of a custom resource, text/html: 406) and impersonated watches (the
    apiserver's own 403, or the whole stream for an allowed identity) reach the client word for
    word, and none of them counts as served from the cache."""
    a, _ = spaces
    t = [("watch", "true"), ("timeoutSeconds", "3")]
    bad_options = [
        [("resourceVersionMatch", "Exact")],
        [("resourceVersionMatch", "NotOlderThan")],
        [("resourceVersionMatch", "Bogus")],
        [("sendInitialEvents", "true")],
        [("sendInitialEvents", "false")],
        [("sendInitialEvents", "true"), ("resourceVersionMatch", "Exact")],
        [("sendInitialEvents", "false"), ("resourceVersionMatch", "Exact"), ("resourceVersion", "5")],
        [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("continue", "abc")],
        [("continue", "abc")],
        [("resourceVersion", "abc")],
        [("resourceVersion", "-1")],
        [("timeoutSeconds", "abc")],
        [("fieldSelector", "spec.bogus=x")],
        [("labelSelector", "a b")],
        [("labelSelector", "app in (web")],
    ]
    work = [diff(ws, PODS.path(a), t + p, is_list=False) for p in bad_options]
    work += [diff(ws, CONFIGMAPS.path(None), t + p, is_list=False) for p in bad_options[::3]]
    work += [
        diff(ws, GIZMOS.path(a), [*t, ("fieldSelector", "spec.size=3")], is_list=False),
        diff(ws, GIZMOS.path(a), [*t, ("resourceVersionMatch", "Exact")], is_list=False),
    ]
    for res in (PODS, CONFIGMAPS, GIZMOS):
        for accept in (YAML, "text/html", f"{YAML}, text/html"):
            work.append(diff(ws, res.path(a), t, accept=accept, is_list=False))
    work.append(diff(ws, GIZMOS.path(a), t, accept=PB_WATCH, is_list=False))
    # Impersonation: the apiserver answers as that user (kproxy passes the headers on).
    work.append(diff(ws, PODS.path(a), t, is_list=False, headers={"Impersonate-User": "nobody"}))
    masters = {"Impersonate-User": "someone", "Impersonate-Group": "system:masters"}
    work.append(diff(ws, PODS.path(a), [*t, ("resourceVersion", "0")], is_list=False, headers=masters))
    work.append(diff(ws, GIZMOS.path(None), t, accept=PROTOBUF, is_list=False))
    before = {res.label: watch_reads(watch_proxy, res.label) for res in (PODS, CONFIGMAPS, GIZMOS)}
    found = await gather_limited(work, 8)
    for label, was in before.items():
        now = watch_reads(watch_proxy, label)
        if now != was:
            found.add(f"{label}: invalid watches", "served from the cache", 0, now - was)
    assert not found, found.report()


# --------------------------------------------------------------------------- many watchers, many writes


async def test_watch_many_watchers_during_burst(
    ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """24 watchers through kproxy (and a twin of each straight on the apiserver), with different
    selectors, forms and encodings, while 6 writers make 200 changes at once: each kproxy watcher
    ends with exactly the state the apiserver lists for its selector, through the same events as
    its twin."""
    a, _ = spaces
    w = Writer(ws)
    rng = random.Random(5)
    apps = ("a", "b", "c")

    def rand_labels() -> dict[str, str]:
        out = {"app": rng.choice(apps)}
        if rng.random() < 0.5:
            out["tier"] = rng.choice(("x", "y"))
        return out

    names = [f"burst-{i:02d}" for i in range(30)]
    for name in names[:20]:
        await w.create(PODS, a, pod(name, rand_labels()))
    await caught_up(ws, PODS)
    selectors: list[tuple[str | None, str | None]] = [
        (None, None),
        ("app=a", None),
        ("app=b", None),
        ("app in (a,c)", None),
        ("app!=c,tier", None),
        ("!tier", None),
        (None, "status.phase=Running"),
        ("app=a", "status.phase!=Running"),
    ]
    forms = [
        [],
        [("resourceVersion", "0")],
        [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("allowWatchBookmarks", "true")],
    ]
    specs = []
    for i, (lsel, fsel) in enumerate(selectors):
        for j, form in enumerate(forms):
            params = list(form)
            if lsel:
                params.append(("labelSelector", lsel))
            if fsel:
                params.append(("fieldSelector", fsel))
            specs.append((params, PB_WATCH if (i + j) % 2 else JSON))
    before = watch_reads(watch_proxy, "pods")
    pairs = await asyncio.gather(*(ws.pair(PODS.path(a), p, accept=acc) for p, acc in specs))
    sem = asyncio.Semaphore(6)
    live = set(names[:20])

    busy: set[str] = set()

    async def change(k: int) -> None:
        async with sem:
            name = rng.choice([n for n in names if n not in busy])  # one change per object at a time
            busy.add(name)
            try:
                if name not in live:
                    live.add(name)
                    await w.create(PODS, a, pod(name, rand_labels()))
                elif k % 9 == 0:
                    live.discard(name)
                    await w.delete(PODS, a, name)
                elif k % 3 == 0:
                    phase = rng.choice(("Running", "Pending", "Failed"))
                    await w.patch(PODS, a, name, phase_patch(phase), status=True)
                else:
                    new: dict[str, str | None] = {"tier": None, **rand_labels()}
                    await w.patch(PODS, a, name, relabel(**new))
            finally:
                busy.discard(name)

    found = Mismatches()
    try:
        await asyncio.gather(*(change(k) for k in range(200)))
        finals = []
        for params, _ in specs:
            q = [(k, v) for k, v in params if k in ("labelSelector", "fieldSelector")]
            status, doc = await ws.get_json(query_path(PODS.path(a), q))
            assert status == 200, doc
            finals.append({f"{a}/{i['metadata']['name']}": int(i["metadata"]["resourceVersion"]) for i in doc["items"]})

        async def converge(s: WatchStream, final: dict[str, int]) -> None:
            await s.wait_for(lambda st: local_state(st.content()) == final, 90)

        await asyncio.gather(*(converge(s, final) for (d, p), final in zip(pairs, finals, strict=True) for s in (d, p)))
        deliveries = 0
        for (params, acc), (direct, proxied), final in zip(specs, pairs, finals, strict=True):
            label = f"burst watcher {params} [{acc}]"
            deliveries += len(proxied.events)
            if local_state(direct.content()) != final:
                found.add(
                    label, "harness: the apiserver's own watcher's final state", final, local_state(direct.content())
                )
            if local_state(proxied.content()) != final:
                found.add(label, "final state through kproxy", final, local_state(proxied.content()))
            initial = not any(k == "resourceVersion" and v not in ("", "0") for k, v in params)
            found.extend(
                compare_streams(
                    label, direct, proxied, bookmarks_asked="allowWatchBookmarks" in dict(params), initial=initial
                )
            )
        served = watch_reads(watch_proxy, "pods") - before
        if served != len(specs):
            found.add("burst watchers served from the cache", upstream_reasons(watch_proxy, "pods"), len(specs), served)
        assert deliveries > 200, f"only {deliveries} events reached the kproxy watchers: the burst did not happen?"
    finally:
        await asyncio.gather(*(s.close() for pair in pairs for s in pair))
    assert not found, found.report()


# --------------------------------------------------------------------------- watches opened while objects change


def _start_rv(stream: WatchStream) -> int | None:
    """The resourceVersion a watch with initial events started from: its initial-events-end bookmark's."""
    end = next((e for e in stream.events if e.is_initial_end), None)
    return end.rv if end is not None else None


Started = tuple[Spec, int, WatchStream, WatchStream]


async def check_from_own_start(sc: Scenario, opened: list[Started], timeout: float = 90.0) -> Mismatches:
    """Each stream of watches opened while objects changed, against what the recorder implies
    from the stream's own start (its initial-events-end bookmark, or the N it asked for); pairs
    that started alike are also compared with each other. ``opened``: (spec, the last write
    acknowledged before it was sent, apiserver's stream, kproxy's stream)."""
    assert sc.oracle is not None and sc.recorder is not None
    oracle = sc.oracle
    oracle.changes = [e for e in sc.recorder.events if e.type != "BOOKMARK"]

    def plan(spec: Spec, s: WatchStream) -> list[Any] | None:
        if spec.mode() == "since":
            return oracle.expected(spec, 0)
        start = _start_rv(s)
        return oracle.expected(spec, start) if start is not None else None

    async def settle(spec: Spec, s: WatchStream) -> None:
        await s.wait_for(lambda st: plan(spec, st) is not None, timeout)
        want = plan(spec, s)
        if want is not None:
            await s.wait_for(lambda st: len(st.content()) >= len(want), timeout)

    await asyncio.gather(*(settle(spec, s) for spec, _, d, p in opened for s in (d, p)))
    found = Mismatches()
    for spec, acked, d, p in opened:
        label = f"{spec.label} [{spec.accept}]"
        for who, s in (("apiserver", d), ("kproxy", p)):
            what = f"{who}'s events against the recorder" if who == "kproxy" else "harness: the apiserver's events"
            want = plan(spec, s)
            if s.status != 200 or want is None:
                found.add(label, f"{who}: a stream with an initial-events-end bookmark", 200, (s.status, s.failure))
                continue
            got = as_expected(s.content())
            if got != want:
                shown = [e.short() for e in want][-40:], [e.short() for e in got][-40:]
                found.add(label, f"{what} (start {_start_rv(s)}, last 40 of {len(want)}/{len(got)})", *shown)
            start = _start_rv(s)
            if spec.values().get("resourceVersion") is None and start is not None and start < acked:
                found.add(label, f"{who}: consistent watch started before a write acknowledged earlier", acked, start)
        if spec.mode() == "since" or _start_rv(d) == _start_rv(p):
            found.extend(
                compare_streams(label, d, p, bookmarks_asked=spec.bookmarks(), initial=spec.mode() == "initial")
            )
    return found


async def test_watch_opened_while_writing(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """Watches opened at several moments while three writers keep changing pods. Each stream must
    be exactly what the recorder implies for its own starting point: the initial events are the
    state at the resourceVersion of its initial-events-end bookmark (a consistent snapshot, no
    event lost or repeated between the snapshot and the live events), a consistent watch (no
    resourceVersion) starts no older than the last write acknowledged before it was sent, and
    watches from a resourceVersion N deliver every change after N; those (same start on both
    sides) are also compared byte for byte with the apiserver's."""
    a, _ = spaces
    w = Writer(ws)
    rng = random.Random(11)
    names = [f"churn-{i:02d}" for i in range(12)]
    for name in names[:8]:
        await w.create(PODS, a, pod(name, {"app": rng.choice("xyz")}))
    sc = Scenario(ws, PODS)
    await sc.start()
    assert sc.oracle is not None
    n0 = sc.oracle.list_rv
    sels = [
        EVERYTHING,
        Sel("app=x", "app=x", None, lambda o: labels(o).get("app") == "x"),
        Sel("phase=Running", None, "status.phase=Running", lambda o: _phase(o) == "Running"),
    ]
    live, busy = set(names[:8]), set[str]()
    done = 0

    async def writer() -> None:
        nonlocal done
        for k in range(90):
            name = rng.choice([n for n in names if n not in busy])
            busy.add(name)
            try:
                if name not in live:
                    live.add(name)
                    await w.create(PODS, a, pod(name, {"app": rng.choice("xyz")}))
                elif k % 7 == 0:
                    live.discard(name)
                    await w.delete(PODS, a, name)
                elif k % 2:
                    await w.patch(PODS, a, name, phase_patch(rng.choice(("Running", "Pending"))), status=True)
                else:
                    await w.patch(PODS, a, name, relabel(app=rng.choice("xyz")))
            finally:
                busy.discard(name)
            done += 1

    opened: list[Started] = []

    async def open_at(after: int) -> None:
        """Once ``after`` changes are made, open every form (the writers keep going)."""
        while done < after:
            await asyncio.sleep(0.01)
        acked = w.last_rv  # acknowledged before the requests are sent
        forms = rv_forms(n0)
        for i, sel in enumerate(sels):
            for f in ("sie+bm", "unset+bm", "0+bm", "N", "nosie+N"):
                accept = PB_WATCH if (i + after) % 2 else JSON
                spec = make_spec(PODS, a, f"{f}@{after}", forms[f], sel, accept)
                d, p = await ws.pair(spec.path, spec.params, accept=accept, label=spec.label)
                opened.append((spec, acked, d, p))

    before = watch_reads(watch_proxy, "pods")
    try:
        await asyncio.gather(writer(), writer(), writer(), open_at(5), open_at(60), open_at(150))
        await sc.seen(w.last_rv)
        found = await check_from_own_start(sc, opened)
        served = watch_reads(watch_proxy, "pods") - before
        if served != len(opened):
            found.add("watches served from the cache", upstream_reasons(watch_proxy, "pods"), len(opened), served)
    finally:
        await asyncio.gather(*(s.close() for _, _, d, p in opened for s in (d, p)))
        await sc.close()
    assert not found, found.report()


async def test_watch_large_initial_state_while_writing(
    ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """1,500 configmaps (about 2 MB of initial events, written by kproxy in several batches) while
    writers keep changing them: the changes that arrive during the initial events must follow
    them, none lost or repeated, each stream exactly what the recorder implies from its own start."""
    a, _ = spaces
    w = Writer(ws)
    names = [f"big-{i:04d}" for i in range(1500)]
    sem = asyncio.Semaphore(8)

    async def create(name: str) -> None:
        async with sem:
            lbls = {"team": ("red", "blue")[int(name[-1]) % 2]}
            await w.create(CONFIGMAPS, a, configmap(name, lbls, {"v": name * 60}))

    await asyncio.gather(*(create(n) for n in names))
    sc = Scenario(ws, CONFIGMAPS)
    await sc.start(settle_timeout=120)
    assert sc.oracle is not None
    n0 = sc.oracle.list_rv
    rng = random.Random(3)
    stop = asyncio.Event()

    async def writer() -> None:
        k = 0
        while not stop.is_set():
            name = rng.choice(names)
            k += 1
            await w.patch(CONFIGMAPS, a, name, relabel(team=rng.choice(("red", "blue")), k=str(k)))

    red = Sel("team=red", "team=red", None, lambda o: labels(o).get("team") == "red")
    opened: list[Started] = []
    forms = rv_forms(n0)
    before = watch_reads(watch_proxy, "configmaps")
    writers = [asyncio.create_task(writer()) for _ in range(3)]
    try:
        for f, sel, accept in (
            ("sie+bm", EVERYTHING, JSON),
            ("unset+bm", EVERYTHING, PB_WATCH),
            ("0+bm", red, JSON),
            ("sie+bm", red, PB_WATCH),
            ("N", EVERYTHING, JSON),
        ):
            await w.patch(CONFIGMAPS, a, names[0], {"data": {"v": f}})
            acked = w.last_rv
            spec = make_spec(CONFIGMAPS, a, f"{f} (1,500 objects)", forms[f], sel, accept)
            d, p = await ws.pair(spec.path, spec.params, accept=accept, label=spec.label)
            opened.append((spec, acked, d, p))
        # Let the writers run until every stream is past its initial events.
        await asyncio.gather(
            *(
                s.wait_for(lambda st: _start_rv(st) is not None, 120)
                for spec, _, d, p in opened
                if spec.mode() == "initial"
                for s in (d, p)
            )
        )
        stop.set()
        await asyncio.gather(*writers)
        await sc.seen(w.last_rv)
        found = await check_from_own_start(sc, opened, timeout=120)
        served = watch_reads(watch_proxy, "configmaps") - before
        if served != len(opened):
            found.add("watches served from the cache", upstream_reasons(watch_proxy, "configmaps"), len(opened), served)
    finally:
        stop.set()
        for t in writers:
            t.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        await asyncio.gather(*(s.close() for *_, d, p in opened for s in (d, p)))
        await sc.close()
    assert not found, found.report()


def _num(o: Obj) -> int | None:
    value = labels(o).get("num")
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


async def test_watch_selector_operators(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """Every label selector operator (=, ==, !=, in, notin, exists, !exists, >, <) and their
    transitions as labels change, and sendInitialEvents from a resourceVersion the cache reaches
    only once the next write lands (the watch waits for it, then starts from there)."""
    a, _ = spaces
    w = Writer(ws)
    for i in range(8):
        lbls = {"num": str(i), "tier": ("front", "back", "db")[i % 3]}
        if i % 2:
            lbls["env"] = "prod"
        await w.create(PODS, a, pod(f"o-{i}", lbls))
    sc = Scenario(ws, PODS)
    await sc.start()
    assert sc.oracle is not None
    forms = rv_forms(sc.oracle.list_rv)
    sels = [
        Sel("num>3", "num>3", None, lambda o: (_num(o) or 0) > 3 and _num(o) is not None),
        Sel("num<2", "num<2", None, lambda o: _num(o) is not None and (_num(o) or 0) < 2),
        Sel("tier notin (front)", "tier notin (front)", None, lambda o: labels(o).get("tier") != "front"),
        Sel("env", "env", None, lambda o: "env" in labels(o)),
        Sel("!env", "!env", None, lambda o: "env" not in labels(o)),
        Sel("env=prod,num>1", "env=prod,num>1", None, lambda o: labels(o).get("env") == "prod" and (_num(o) or 0) > 1),
        Sel(
            "tier in (db,back),!env",
            "tier in (db,back),!env",
            None,
            lambda o: labels(o).get("tier") in ("db", "back") and "env" not in labels(o),
        ),
    ]
    specs = [
        make_spec(PODS, a, f, forms[f], sel, acc) for sel in sels for f, acc in (("unset+bm", JSON), ("N", PB_WATCH))
    ]

    async def phase1() -> int:
        mid = await w.patch(PODS, a, "o-0", relabel(num="9", env="dev"))
        await w.patch(PODS, a, "o-3", relabel(num="x", tier="front"))
        await w.patch(PODS, a, "o-4", relabel(env=None, tier="db"))
        await w.patch(PODS, a, "o-5", relabel(num="10"))
        assert mid is not None
        return mid

    def wave2(mid: int) -> list[Spec]:
        return [make_spec(PODS, a, "N(mid)", rv_forms(mid)["N"], sel) for sel in sels]

    async def phase2() -> None:
        await w.patch(PODS, a, "o-1", relabel(env=None))
        await w.delete(PODS, a, "o-6")
        await w.patch(PODS, a, "o-7", relabel(num="2"))

    try:
        found, _ = await run_waves(sc, w, watch_proxy, specs, phase1, wave2, phase2)
    finally:
        await sc.close()

    # sendInitialEvents from a resourceVersion just ahead: opened, then the write that reaches it.
    sc2 = Scenario(ws, PODS)
    await sc2.start()
    assert sc2.oracle is not None
    ahead = sc2.oracle.list_rv + 1
    params = [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", str(ahead))]
    opened: list[Started] = []
    try:
        for accept in (JSON, PB_WATCH):
            spec = make_spec(PODS, a, "sie+N+1+bm", [*params, ("allowWatchBookmarks", "true")], EVERYTHING, accept)
            pair = asyncio.create_task(ws.pair(spec.path, spec.params, accept=accept, label=spec.label))
            await w.patch(PODS, a, "o-2", {"metadata": {"annotations": {"reached": accept}}})
            d, p = await pair
            opened.append((spec, ahead, d, p))
        await sc2.seen(w.last_rv)
        found.extend(await check_from_own_start(sc2, opened))
        for spec, _, _d, p in opened:
            start = _start_rv(p)
            if start is None or start < ahead:
                found.add(spec.label, "kproxy's initial events at or after the requested resourceVersion", ahead, start)
    finally:
        await asyncio.gather(*(s.close() for *_, d, p in opened for s in (d, p)))
        await sc2.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- other spellings of the same watch


async def test_watch_spellings(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """Other ways to write a watch, read exactly as the apiserver reads them: boolean parameters
    spelled ``1``, ``True``, ``FALSE``, ``0`` or empty (empty is true), ``pretty`` (never applied to
    watch frames), ``timeout`` (ignored for watches), empty selectors, ``==`` in selectors, the
    deprecated ``/watch/`` path, Accept headers real clients send (none at all, ``*/*``,
    ``;stream=watch``, q-values)."""
    a, _ = spaces
    w = Writer(ws)
    await w.create(PODS, a, pod("s-0", {"app": "web"}))
    await w.create(PODS, a, pod("s-1", {"app": "db"}))
    sc = Scenario(ws, PODS)
    await sc.start()
    assert sc.oracle is not None
    n = str(sc.oracle.list_rv)
    # The selectors are spelled in the parameters below; these only carry their meaning.
    web = Sel("app=web", None, None, POD_SELECTORS[0].test)
    running = Sel("phase=Running", None, None, POD_SELECTORS[3].test)
    sie = [("sendInitialEvents", "True"), ("resourceVersionMatch", "NotOlderThan")]
    variants: list[tuple[str, list[tuple[str, str]], Sel, str, str | None]] = [
        ("watch=1", [("watch", "1")], EVERYTHING, JSON, None),
        ("watch=", [("watch", "")], EVERYTHING, JSON, None),
        ("watch=True+rv", [("watch", "True"), ("resourceVersion", n)], EVERYTHING, JSON, None),
        ("bookmarks empty", [("allowWatchBookmarks", "")], EVERYTHING, JSON, None),
        ("bookmarks FALSE", [("allowWatchBookmarks", "FALSE"), *sie], EVERYTHING, JSON, None),
        ("bookmarks 0", [("allowWatchBookmarks", "0")], EVERYTHING, PB_WATCH, None),
        ("bookmarks yes", [("allowWatchBookmarks", "yes"), *sie], EVERYTHING, JSON, None),
        (
            "sie FALSE",
            [("sendInitialEvents", "FALSE"), ("resourceVersionMatch", "NotOlderThan")],
            EVERYTHING,
            JSON,
            None,
        ),
        (
            "sie=false rv=0",
            [("sendInitialEvents", "false"), ("resourceVersionMatch", "NotOlderThan"), ("resourceVersion", "0")],
            EVERYTHING,
            JSON,
            None,
        ),
        ("pretty", [("pretty", "true"), ("allowWatchBookmarks", "1")], EVERYTHING, JSON, None),
        ("pretty=1 rv", [("pretty", "1"), ("resourceVersion", n)], EVERYTHING, JSON, None),
        ("timeout=1s", [("timeout", "1s"), ("resourceVersion", n)], EVERYTHING, JSON, None),
        ("timeoutSeconds=600", [("timeoutSeconds", "600")], EVERYTHING, PB_WATCH, None),
        ("empty selectors", [("labelSelector", ""), ("fieldSelector", "")], EVERYTHING, JSON, None),
        ("app==web", [("labelSelector", "app==web")], web, JSON, None),
        ("spaces in selector", [("labelSelector", " app = web ")], web, JSON, None),
        (
            "phase==Running",
            [("fieldSelector", "status.phase==Running")],
            running,
            JSON,
            None,
        ),
        ("/watch/ path", [], EVERYTHING, JSON, f"/api/v1/watch/namespaces/{a}/pods"),
        ("/watch/ path rv", [("resourceVersion", n)], EVERYTHING, PB_WATCH, f"/api/v1/watch/namespaces/{a}/pods"),
        ("no Accept", [], EVERYTHING, "", None),
        ("*/*", [("resourceVersion", n)], EVERYTHING, "*/*", None),
        ("json;stream=watch", [], EVERYTHING, "application/json;stream=watch", None),
        ("json, */*", [("allowWatchBookmarks", "true")], EVERYTHING, "application/json, */*", None),
        ("pb+json stream", [("labelSelector", "app=web")], web, f"{PB_WATCH}, application/json;stream=watch", None),
        ("q-values", [], EVERYTHING, f"{JSON};q=0.5, {PROTOBUF}", None),
    ]
    specs = []
    for name, params, sel, accept, raw_path in variants:
        spec = make_spec(PODS, a, name, params, sel, accept)
        specs.append(Spec(spec.label, spec.res, spec.namespace, spec.params, spec.matches, accept, raw_path))

    async def phase1() -> int:
        mid = await w.patch(PODS, a, "s-0", relabel(app="db"))
        await w.patch(PODS, a, "s-1", phase_patch("Running"), status=True)
        await w.patch(PODS, a, "s-1", relabel(app="web"))
        assert mid is not None
        return mid

    async def phase2() -> None:
        await w.create(PODS, a, pod("s-2", {"app": "web"}))
        await w.delete(PODS, a, "s-0")

    try:
        found, _ = await run_waves(sc, w, watch_proxy, specs, phase1, lambda mid: [], phase2)
    finally:
        await sc.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- a cluster-scoped resource


def node(name: str, lbls: Mapping[str, str], unschedulable: bool = False) -> dict[str, Any]:
    spec = {"unschedulable": True} if unschedulable else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(lbls)}, "spec": spec}


async def test_watch_cluster_scoped_nodes(ws: WatchSides, watch_proxy: RunningProxy) -> None:
    """Nodes (cluster-scoped: initial events in name order, no namespace), with label selectors
    and the spec.unschedulable field selector flipping, JSON and protobuf."""
    prefix = f"wdiff-{secrets.token_hex(3)}"
    names = [f"{prefix}-n{i}" for i in range(5)]
    w = Writer(ws)
    try:
        for i, name in enumerate(names[:4]):
            await w.create(NODES, None, node(name, {"pool": ("a", "b")[i % 2]}, unschedulable=i == 3))
        sc = Scenario(ws, NODES)
        await sc.start()
        assert sc.oracle is not None
        forms = rv_forms(sc.oracle.list_rv)

        pool_a = Sel("pool=a", "pool=a", None, lambda o: labels(o).get("pool") == "a")
        cordoned = Sel(
            "unschedulable", None, "spec.unschedulable=true", lambda o: bool((o.get("spec") or {}).get("unschedulable"))
        )
        schedulable = Sel(
            "schedulable",
            None,
            "spec.unschedulable!=true",
            lambda o: not (o.get("spec") or {}).get("unschedulable"),
        )
        # Nodes other tests left are in every stream alike (initial events); the oracle lists them too.
        wave1 = [make_spec(NODES, None, f, forms[f], EVERYTHING) for f in ("unset", "0", "N", "sie+bm", "nosie")]
        wave1 += [
            make_spec(NODES, None, f, forms[f], s) for s in (pool_a, cordoned, schedulable) for f in ("unset", "N")
        ]
        wave1 += [make_spec(NODES, None, f, forms[f], EVERYTHING, PB_WATCH) for f in ("unset+bm", "N")]
        wave1 += [make_spec(NODES, None, "unset", forms["unset"], cordoned, PB_CLIENT_GO)]

        async def phase1() -> int:
            await w.patch(NODES, None, names[0], {"spec": {"unschedulable": True}})
            mid = await w.patch(NODES, None, names[1], relabel(pool="a"))
            await w.delete(NODES, None, names[2])
            await w.create(NODES, None, node(names[4], {"pool": "a"}, unschedulable=True))
            assert mid is not None
            return mid

        def wave2(mid: int) -> list[Spec]:
            f2 = rv_forms(mid)
            return [make_spec(NODES, None, "N(mid)", f2["N"], s) for s in (EVERYTHING, cordoned, pool_a)]

        async def phase2() -> None:
            await w.patch(NODES, None, names[3], {"spec": {"unschedulable": None}})
            await w.patch(NODES, None, names[0], relabel(pool="b"))
            await w.patch(NODES, None, names[4], {"metadata": {"annotations": {"x": "y"}}})

        try:
            found, _ = await run_waves(sc, w, watch_proxy, wave1, phase1, wave2, phase2)
        finally:
            await sc.close()
    finally:
        for name in names:
            await ws.request("DELETE", NODES.item(None, name), via_proxy=False)
    assert not found, found.report()


# --------------------------------------------------------------------------- credentials: forward


@pytest.fixture(scope="module")
def forward_watch_proxy(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """The pod cache behind `credentials: forward` (callers' bearer tokens; a denial is reused
    for 1 s only, so a new grant shows quickly)."""
    flt = {"name": "watchcache", "resources": ["pods"], "authorization": {"allow_ttl": 30, "deny_ttl": 1}}
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-watchdiff-fwd"),
        control_plane.admin_kubeconfig,
        credentials="forward",
        tls=True,
        extra={"filters": [flt]},
    )
    yield rp
    rp.stop()


async def _grant(sides: WatchSides, namespace: str, verbs: list[str]) -> None:
    """A Role on pods with ``verbs`` for the test user, bound in ``namespace`` (as admin)."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "wdiff-pods"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": verbs}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "wdiff-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wdiff-pods"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER_NAME}],
    }
    for path, body in ((f"{rbac}/roles", role), (f"{rbac}/rolebindings", binding)):
        answer = await sides.request(
            "POST", path, via_proxy=False, data=json.dumps(body).encode(), headers={"Content-Type": JSON}
        )
        assert answer.status == 201, answer.body[:300]


async def test_watch_authorization_forward(
    control_plane: ControlPlaneInfo, forward_watch_proxy: RunningProxy, spaces: tuple[str, str]
) -> None:
    """`credentials: forward`: a cached watch is authorized for the caller when it starts, as the
    apiserver does: without RBAC the apiserver's own 403 (byte for byte, JSON and protobuf); with
    `list` but not `watch` on pods still 403; with `watch` in one namespace the stream equals the
    apiserver's, served from the cache, while a cluster-wide watch stays 403."""
    a, b = spaces
    rp = forward_watch_proxy
    admin = BearerWatchSides(control_plane, rp, control_plane.admin_token)
    user = BearerWatchSides(control_plane, rp, control_plane.user_token)
    w = Writer(admin)
    sc = Scenario(admin, PODS, watcher=user)
    try:
        for ns in (a, b):
            await w.create(PODS, ns, pod("f-0", {"app": "web"}))
            await w.create(PODS, ns, pod("f-1", {"app": "db"}))
        await caught_up(admin, PODS)
        found = Mismatches()
        # No RBAC at all.
        denied = [
            (PODS.path(a), [], JSON),
            (PODS.path(a), [("resourceVersion", "0")], PB_WATCH),
            (PODS.path(None), [("allowWatchBookmarks", "true")], JSON),
        ]
        pairs = await asyncio.gather(*(user.pair(path, p, accept=acc) for path, p, acc in denied))
        for (path, p, acc), (d, px) in zip(denied, pairs, strict=True):
            if d.status != 403:
                found.add(f"{path} {p}", "harness: the apiserver's answer to a user without RBAC", 403, d.status)
            found.extend(compare_streams(f"no RBAC: {path} {p} [{acc}]", d, px, bookmarks_asked=False, initial=True))
            await asyncio.gather(d.close(), px.close())
        await _grant(admin, a, ["get", "list", "watch"])
        await _grant(admin, b, ["get", "list"])

        async def allowed() -> bool:
            d, px = await user.pair(PODS.path(a), [("timeoutSeconds", "1")])
            await asyncio.gather(d.close(), px.close())
            return d.status == px.status == 200

        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while not await allowed():
            assert loop.time() < end, "the RoleBinding never took effect"
            await asyncio.sleep(0.2)

        await sc.start()
        assert sc.oracle is not None
        forms = rv_forms(sc.oracle.list_rv)
        wave1 = [make_spec(PODS, a, f, forms[f], EVERYTHING) for f in ("unset", "0", "N", "sie+bm", "nosie")]
        wave1 += [make_spec(PODS, a, f, forms[f], POD_SELECTORS[0], PB_WATCH) for f in ("unset+bm", "N")]
        wave1 += [make_spec(PODS, b, f, forms[f], EVERYTHING) for f in ("unset", "N")]  # list, not watch
        wave1 += [make_spec(PODS, None, "N", forms["N"], EVERYTHING, PB_WATCH)]  # no cluster-wide grant

        async def phase1() -> int:
            mid = await w.patch(PODS, a, "f-0", relabel(app="db"))
            await w.create(PODS, b, pod("f-2", {"app": "web"}))
            assert mid is not None
            return mid

        async def phase2() -> None:
            await w.delete(PODS, a, "f-1")
            await w.create(PODS, a, pod("f-3", {"app": "web"}))

        found2, opened = await run_waves(sc, w, rp, wave1, phase1, lambda mid: [], phase2)
        found.extend(found2)
        for o in opened:
            want = 200 if o.spec.namespace == a else 403
            if o.direct.status != want:
                found.add(o.spec.label, "harness: the apiserver's status for the user", want, o.direct.status)
    finally:
        await sc.close()
        await user.close()
        await admin.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- metadata only


#: What client-go's metadata client sends for a watch (the garbage collector's and the quota
#: controller's informers), and the same in JSON alone.
META_PB = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
META_JSON = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


async def test_metadata_only_watches(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """``as=PartialObjectMetadata`` watches (metadata informers) served from the cache: every
    event's object and every bookmark transformed as the apiserver transforms them, in protobuf
    and JSON, with label selectors whose matches flip, DELETED events at the deletion's version;
    a second wave from the middle of the history."""
    a, b = spaces
    w = Writer(ws)
    for i in range(4):
        await w.create(PODS, a, pod(f"m-{i}", {"app": ("web", "db")[i % 2]}))
    await w.create(CONFIGMAPS, b, configmap("m-cm", {"app": "web"}, {"k": "v"}))
    sc = Scenario(ws, PODS)
    await sc.start()
    try:
        assert sc.oracle is not None
        forms = rv_forms(sc.oracle.list_rv)
        wave1 = [
            make_spec(PODS, ns, f, forms[f], sel, accept)
            for accept in (META_PB, META_JSON, f"{META_PB}, {META_JSON}, {PB_CLIENT_GO}")
            for ns, f, sel in ((a, "unset+bm", EVERYTHING), (None, "N", POD_SELECTORS[0]), (a, "sie+bm", EVERYTHING))
        ]

        async def phase1() -> int:
            mid = await w.patch(PODS, a, "m-0", relabel(app="db"))
            await w.delete(PODS, a, "m-1")
            assert mid is not None
            return mid

        async def phase2() -> None:
            await w.create(PODS, a, pod("m-9", {"app": "web"}))
            await w.patch(PODS, a, "m-2", relabel(app="web"))

        def wave2(mid: int) -> list[Spec]:
            return [
                make_spec(PODS, a, f"{mid}", [("resourceVersion", str(mid))], EVERYTHING, accept)
                for accept in (META_PB, META_JSON)
            ]

        found, _ = await run_waves(sc, w, watch_proxy, wave1, phase1, wave2, phase2)
    finally:
        await sc.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- compression


async def test_watch_accept_encoding(ws: WatchSides, watch_proxy: RunningProxy, spaces: tuple[str, str]) -> None:
    """``Accept-Encoding: gzip`` (what Go's transport sends): the apiserver gzips a watch-list
    stream (initial events with the end bookmark) and no other watch; kproxy's Content-Encoding
    and Vary must be the same, and the events, once decompressed, equal."""
    a, _ = spaces
    w = Writer(ws)
    for i in range(6):
        await w.create(PODS, a, pod(f"z-{i}", {"app": ("web", "db")[i % 2]}))
    sc = Scenario(ws, PODS)
    await sc.start()
    assert sc.oracle is not None
    forms = rv_forms(sc.oracle.list_rv)
    encodings = ["gzip", "gzip, deflate", "deflate", "gzip;q=0", "GZIP", "identity", "*"]
    specs = []
    for enc in encodings:
        for f in ("unset+bm", "sie+bm", "unset", "N+bm") if enc == "gzip" else ("unset+bm",):
            spec = make_spec(PODS, a, f"{f} Accept-Encoding={enc}", forms[f], EVERYTHING)
            specs.append(
                Spec(
                    spec.label,
                    spec.res,
                    spec.namespace,
                    spec.params,
                    spec.matches,
                    JSON,
                    None,
                    (("Accept-Encoding", enc),),
                )
            )
    for f, acc, ns in (("sie+bm", PB_WATCH, a), ("0+bm", JSON, a), ("sie", JSON, a), ("unset+bm", JSON, None)):
        spec = make_spec(PODS, ns, f"{f} Accept-Encoding=gzip", forms[f], EVERYTHING, acc)
        specs.append(
            Spec(
                spec.label,
                spec.res,
                spec.namespace,
                spec.params,
                spec.matches,
                acc,
                None,
                (("Accept-Encoding", "gzip"),),
            )
        )

    async def phase1() -> int:
        mid = await w.patch(PODS, a, "z-0", relabel(app="db"))
        await w.delete(PODS, a, "z-1")
        assert mid is not None
        return mid

    async def phase2() -> None:
        await w.create(PODS, a, pod("z-9", {"app": "web"}))

    try:
        found, opened = await run_waves(sc, w, watch_proxy, specs, phase1, lambda mid: [], phase2)
    finally:
        await sc.close()
    gzipped = sum(1 for o in opened if o.direct.headers.get("Content-Encoding") == "gzip")
    if ws.cp.minor is None or ws.cp.minor >= 37:
        assert gzipped, "harness: the apiserver gzipped none of the watch-list streams"
    else:  # before WatchListCompression: never, and kproxy does as this apiserver does
        assert not gzipped, "harness: an apiserver before 1.37 gzipped a watch"
    assert not found, found.report()


# --------------------------------------------------------------------------- through a relist (restarts the apiserver)


def _etcd_delete(cp: ControlPlaneInfo, key: str) -> int:
    """Delete one key straight in etcd (its JSON gateway): a change no apiserver watch reports."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(
        f"{cp.etcd_url}/v3/kv/deleterange", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(json.loads(r.read()).get("deleted", 0))


async def test_watch_through_apiserver_restart_and_relist(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], spaces: tuple[str, str]
) -> None:
    """Watches served by kproxy stay open while the apiserver is killed, a pod is deleted behind
    its back (straight in etcd, so only a relist can tell) and the apiserver comes back with a
    newer resourceVersion (kproxy's resume gets 410 and relists): each watcher gets the
    difference as ordinary events (selector transitions included), never an ERROR, with
    resourceVersions that only go forward, ends with exactly the apiserver's state for its
    selector, and the last resourceVersion it saw is one it can watch from again, through kproxy
    and on the apiserver."""
    a, _ = spaces
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["pods"]}]})
    ws = WatchSides(cp, rp.url)
    later: list[WatchSides] = []
    streams: list[tuple[list[tuple[str, str]], str, WatchStream]] = []
    found = Mismatches()
    try:
        w = Writer(ws)
        for i in range(6):
            await w.create(PODS, a, pod(f"r-{i}", {"app": ("web", "db")[i % 2]}))
        await caught_up(ws, PODS)
        n = str(w.last_rv)
        requests: list[tuple[list[tuple[str, str]], str]] = [
            ([("allowWatchBookmarks", "true")], JSON),
            ([("resourceVersion", n)], JSON),
            ([("labelSelector", "app=web")], PB_WATCH),
            ([("labelSelector", "app=db"), ("allowWatchBookmarks", "true")], JSON),
            ([("resourceVersion", "0")], PB_WATCH),
        ]
        for params, accept in requests:
            s = await ws.watch(PODS.path(a), params, via_proxy=True, accept=accept)
            assert s.status == 200, s.body
            streams.append((params, accept, s))
        await w.patch(PODS, a, "r-0", relabel(app="db"))  # seen live by everyone before the outage
        # Every watcher (whatever its selector) has an event about r-0 from that change: it has
        # caught up with the live stream before the outage.
        before_outage = w.last_rv
        await asyncio.gather(
            *(s.wait_for(lambda st: any(e.rv == before_outage for e in st.events), 30) for _, _, s in streams)
        )

        await asyncio.to_thread(cp.stop_apiserver, kill=True)
        assert _etcd_delete(cp, f"/registry/pods/{a}/r-3") == 1
        await asyncio.to_thread(cp.start_apiserver)
        # New sessions for what follows (the pooled connections to the apiserver died with it);
        # the first ones stay open: closing them would close the watches under test.
        fresh = WatchSides(cp, rp.url)
        later.append(fresh)
        w = Writer(fresh)
        await w.patch(PODS, a, "r-1", relabel(app="web"))
        await w.create(PODS, a, pod("r-9", {"app": "web"}))
        await w.delete(PODS, a, "r-4")
        last_write = await w.patch(PODS, a, "r-5", relabel(app="web"))  # every watcher sees this one
        assert last_write is not None
        finals = []
        for params, _, _ in streams:
            q = [(k, v) for k, v in params if k == "labelSelector"]
            status, doc = await fresh.get_json(query_path(PODS.path(a), q))
            assert status == 200, doc
            finals.append({f"{a}/{i['metadata']['name']}": int(i["metadata"]["resourceVersion"]) for i in doc["items"]})
        await asyncio.gather(
            *(s.wait_for(lambda st: any((e.rv or 0) >= last_write for e in st.events), 60) for _, _, s in streams)
        )
        for (params, accept, s), final in zip(streams, finals, strict=True):
            label = f"kproxy watch {params} [{accept}] through the restart"
            initial = not any(k == "resourceVersion" and v not in ("", "0") for k, v in params)
            if s.done:
                found.add(label, "the watch stayed open", "open", s.failure or "ended")
            errors = [e.obj for e in s.events if e.type == "ERROR"]
            if errors:
                found.add(label, "no ERROR event", [], errors)
            if not any((e.rv or 0) >= last_write for e in s.events):
                found.add(
                    label,
                    f"the change at {last_write}, made after the restart",
                    "delivered",
                    [e.short() for e in s.events],
                )
            have = local_state(s.content())
            if initial and have != final:
                found.add(label, "final state against the apiserver's list", final, have)
            found.extend(check_order(label, s.events, initial=initial))
            last = max((e.rv or 0) for e in s.events if e.type != "ERROR")
            # The next reconnect, from the last resourceVersion seen: kproxy and the apiserver
            # both take it (no 410) and have nothing newer to send.
            for via in (True, False):
                again = await fresh.watch(
                    PODS.path(a), [("resourceVersion", str(last)), ("timeoutSeconds", "2")], via_proxy=via
                )
                await again.wait_end(30)
                who = "kproxy" if via else "the apiserver"
                if again.status != 200 or any(e.type == "ERROR" for e in again.events):
                    found.add(
                        label,
                        f"watching again from {last} on {who}",
                        "200, no ERROR",
                        (again.status, [e.obj for e in again.events][:2]),
                    )
                await again.close()
        relists = [ln for ln in rp.metrics().splitlines() if ln.startswith("kproxy_watchcache_relists_total{")]
        assert any(float(ln.rsplit(" ", 1)[1]) > 0 for ln in relists), f"kproxy never relisted: {relists}"
    finally:
        await asyncio.gather(*(s.close() for _, _, s in streams))
        await asyncio.gather(ws.close(), *(x.close() for x in later))
    assert not found, found.report()
