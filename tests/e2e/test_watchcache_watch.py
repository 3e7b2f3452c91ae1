"""Watches served from the watch cache against the apiserver's own (issue 5, "Differential").

Each test opens the same watch requests straight on the apiserver and through kproxy (watch cache
on pods, configmaps and a custom resource) at the same moment, while a writer creates, relabels
(so that selectors flip), changes the status of, and deletes objects; then compares the two
streams event by event (types, parsed objects, frame bytes; see :mod:`watchcache_watchdiff` for
what may differ) and checks that kproxy served them from its cache
(``kproxy_watchcache_reads_total{verb="watch",served="cache"}``). A recorder watch predicts what
each request must deliver, so every wait ends on an event, not a sleep.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from corpus.compare import JSON
from watchcache_diff import Mismatches
from watchcache_watchdiff import (
    PB_CLIENT_GO,
    PB_WATCH,
    Opened,
    Res,
    Scenario,
    Spec,
    WatchSides,
    Writer,
    labels,
    upstream_reasons,
    watch_reads,
)

from kproxy.testing import crds
from kproxy.testing.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

pytestmark = pytest.mark.e2e

GROUP = "wcwatch.example.com"
PLURAL = "gizmos"
PODS = Res("pods", "/api/v1", "pods", "Pod")
CONFIGMAPS = Res("configmaps", "/api/v1", "configmaps", "ConfigMap")
GIZMOS = Res(f"{PLURAL}.{GROUP}", f"/apis/{GROUP}/v1", PLURAL, "Gizmo")
GIZMO_CRD = crds.crd(
    GROUP, PLURAL, "Gizmo", spec_fields={"color": "string", "size": "integer"}, selectable=[".spec.color"]
)
CACHED = ["pods", "configmaps", f"{GROUP}/v1/{PLURAL}"]
FUTURE = 10**9  # a resourceVersion the test cluster never reaches


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def watch_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy caching pods, configmaps and the gizmos (started once the CRD is served)."""
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
    """Every resourceVersion form of a watch (section 3.7); ``n`` is a recent resourceVersion."""
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
        await w.patch(PODS, a, "p-a4", relabel(app="web"))

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
