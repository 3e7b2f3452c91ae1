"""The watch cache's LIST and GET against the apiserver's own answers.

Every request is sent straight to the apiserver first, then through kproxy with the watchcache
filter on pods, configmaps and secrets, and the two answers are compared by
:mod:`watchcache_diff` (what must be equal and what may differ is written there). Each test sends
its whole batch of combinations, then reports every disagreement at once.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from corpus.compare import Answer, Sides
from watchcache_crd import GROUP, PLURAL, Widgets, widget_proxy, widgets
from watchcache_diff import (
    JSON,
    PROTOBUF,
    YAML,
    Mismatches,
    compare_answers,
    diff,
    gather_limited,
    item_names,
    list_view,
    query_path,
    reads_total,
)
from watchcache_population import (
    BearerSides,
    Population,
    cache_proxy,
    forward_cache_proxy,
    population,
    settle,
    start_cache_proxy,
    wc_sides,
)

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

__all__ = [
    "cache_proxy",
    "forward_cache_proxy",
    "population",
    "wc_sides",
    "widget_proxy",
    "widgets",
]  # module-scoped fixtures used here

FUTURE = 10**9  # far beyond anything the test cluster reaches: always "too large"
CONCURRENCY = 24


def _rv_value(pop: Population, rv: str | None) -> str | None:
    return {"old": str(pop.old_rv), "recent": str(pop.recent_rv), "future": str(FUTURE)}.get(rv or "", rv)


def _params(pop: Population, rv: str | None, rvm: str | None, limit: str | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    value = _rv_value(pop, rv)
    if value is not None:
        out.append(("resourceVersion", value))
    if rvm is not None:
        out.append(("resourceVersionMatch", rvm))
    if limit is not None:
        out.append(("limit", limit))
    return out


def _paths(pop: Population) -> dict[str, str]:
    a, b, c = pop.namespaces
    return {
        "pods-cluster": "/api/v1/pods",
        "pods-ns": f"/api/v1/namespaces/{a}/pods",
        "configmaps-cluster": "/api/v1/configmaps",
        "configmaps-ns": f"/api/v1/namespaces/{b}/configmaps",
        "secrets-cluster": "/api/v1/secrets",
        "secrets-ns": f"/api/v1/namespaces/{b}/secrets",
        "secrets-empty": f"/api/v1/namespaces/{c}/secrets",
    }


RVS: list[str | None] = [None, "", "0", "old", "recent", "future", "not-a-number"]
RVMS_FULL: list[str | None] = [None, "NotOlderThan", "Exact", "Bogus"]
LIMITS_FULL: list[str | None] = [None, "1", "7", "1000"]
RVMS_SHORT: list[str | None] = [None, "NotOlderThan", "Exact"]
LIMITS_SHORT: list[str | None] = [None, "7"]


# --------------------------------------------------------------------------- resourceVersion x match x limit


async def test_list_resource_version_matrix(wc_sides: Sides, population: Population, cache_proxy: RunningProxy) -> None:
    """Every resourceVersion x resourceVersionMatch x limit of the seeds' table, in JSON, cluster-wide
    and in one namespace (the full matrix for pods, most of it for configmaps and secrets): same
    status, same Status bytes, same items (parsed and as encoded), same continue presence and
    remainingItemCount, and a list resourceVersion the request allows. The resourceVersion=0 ones,
    at least, were answered by the cache."""
    cached_before = reads_total(cache_proxy.metrics(), resource="pods", verb="list", served="cache")
    work = []
    for where, path in _paths(population).items():
        full = where.startswith("pods")
        rvms, limits = (RVMS_FULL, LIMITS_FULL) if full else (RVMS_SHORT, LIMITS_SHORT)
        combos = [_params(population, rv, rvm, lim) for rv, rvm, lim in itertools.product(RVS, rvms, limits)]
        work += [diff(wc_sides, path, p) for p in combos]
    # Odd but legal (or not) parameters a cache must read exactly as the apiserver does.
    odd = [[("limit", v)] for v in ("0", "-1", "abc", "1.5", "")] + [
        [("limit", "0"), ("resourceVersion", "0")],
        [("limit", "-1"), ("resourceVersion", str(population.recent_rv))],
        [("limit", "1"), ("limit", "5")],
        [("resourceVersion", "0"), ("resourceVersion", str(FUTURE))],
        [("resourceVersion", str(FUTURE)), ("resourceVersion", "0")],
        [("sendInitialEvents", "true")],
        [("sendInitialEvents", "false"), ("resourceVersion", "0")],
        [("allowWatchBookmarks", "true"), ("resourceVersion", "0")],
        [("timeoutSeconds", "5")],
        [("timeoutSeconds", "x"), ("resourceVersion", "0")],
        [("watch", "false"), ("resourceVersion", "0")],
        [("watch", "0")],
        [("fieldSelector", ""), ("labelSelector", ""), ("resourceVersion", "0")],
        [("unknownParameter", "x"), ("resourceVersion", "0"), ("limit", "2")],
        [("resourceVersion", " 0")],
        [("resourceVersion", "00")],
        [("resourceVersion", "-1")],
        [("resourceVersion", str(population.recent_rv)), ("resourceVersionMatch", "notolderthan")],
        [("resourceVersion", str(population.recent_rv)), ("resourceVersionMatch", "")],
        [("resourceVersion", "0"), ("resourceVersionMatch", ""), ("limit", "3")],
        [("resourceVersionMatch", "")],
    ]
    work += [diff(wc_sides, path, p) for path in ("/api/v1/pods", _paths(population)["configmaps-ns"]) for p in odd]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()
    # resourceVersion=0 with no match or NotOlderThan, any limit: 2 pod paths x 2 matches x 4 limits.
    cached = reads_total(cache_proxy.metrics(), resource="pods", verb="list", served="cache") - cached_before
    assert cached >= 16, f"only {cached} of the pod lists were served from the cache"


async def test_list_encodings(wc_sides: Sides, population: Population) -> None:
    """YAML and protobuf lists: byte-equal items (protobuf item messages, the YAML document up to the
    list's own metadata), and Status errors in the negotiated encoding."""
    paths = _paths(population)
    combos = [_params(population, rv, None, None) for rv in (None, "0", "recent", "future", "not-a-number")]
    combos += [
        _params(population, None, None, "7"),
        _params(population, "0", None, "7"),
        _params(population, "recent", "Exact", None),
    ]
    work = [
        diff(wc_sides, paths[where], p, accept=accept)
        for accept in (YAML, PROTOBUF)
        for where in ("pods-cluster", "configmaps-ns", "secrets-cluster", "secrets-empty")
        for p in combos
    ]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()


@pytest.mark.parametrize(
    "accept",
    [
        f"{PROTOBUF}, {JSON}",
        f"{JSON}, */*",
        "*/*",
        "application/json;q=0.5, application/yaml",
        "text/html",
        "APPLICATION/JSON",
        "application/json; charset=utf-8",
        "application/json;stream=watch",
        f"{PROTOBUF};stream=watch",
        "application/json;as=Table",
        "application/yaml;q=0, application/json;q=0.1",
    ],
)
async def test_list_accept_negotiation(wc_sides: Sides, population: Population, accept: str) -> None:
    """Accept headers that real clients send (client-go's protobuf-then-JSON, q-values, */*), and one
    no encoding satisfies (406 from the apiserver's router)."""
    combos = [_params(population, rv, None, lim) for rv, lim in itertools.product([None, "0"], [None, "7"])]
    found = await gather_limited((diff(wc_sides, "/api/v1/pods", p, accept=accept) for p in combos), CONCURRENCY)
    assert not found, found.report()


async def test_list_pretty(wc_sides: Sides, population: Population) -> None:
    """``?pretty=true`` indents the apiserver's JSON; the cached list must be indented the same way."""
    ns = population.namespaces[1]
    found = await gather_limited(
        (
            diff(wc_sides, path, [*p, ("pretty", "true")])
            for path in (f"/api/v1/namespaces/{ns}/configmaps", f"/api/v1/namespaces/{ns}/pods")
            for p in ([], [("resourceVersion", "0")], [("limit", "3")])
        ),
        CONCURRENCY,
    )
    assert not found, found.report()


async def test_odd_requests(wc_sides: Sides, population: Population) -> None:
    """Browsers and curl (pretty JSON by User-Agent), HEAD, a trailing slash, a parameter name in
    the wrong case, %20 instead of + in a selector, an invalid namespace name."""
    b = population.namespaces[1]
    cms = f"/api/v1/namespaces/{b}/configmaps"
    rv0 = [("resourceVersion", "0")]
    work = [
        diff(wc_sides, target, p, headers={"User-Agent": ua}, is_list=not target.endswith("tricky"))
        for ua in ("curl/8.5.0", "Mozilla/5.0 (X11; Linux x86_64)", "Wget/1.21", "kubectl/v1.37.1")
        for target in (cms, f"{cms}/tricky", "/api/v1/pods")
        for p in ([], rv0, [("limit", "2")])
    ]
    work += [
        diff(wc_sides, cms, rv0, method="HEAD", is_list=False),
        diff(wc_sides, f"{cms}/tricky", rv0, method="HEAD", is_list=False),
        diff(wc_sides, f"{cms}/", rv0),
        diff(wc_sides, f"{cms}/", []),
        diff(wc_sides, cms, [("resourceversion", "0")]),
        diff(wc_sides, cms, [("ResourceVersion", "0"), ("LIMIT", "1")]),
        diff(wc_sides, f"{cms}?labelSelector=team%20in%20(red)&resourceVersion=0", []),
        diff(wc_sides, f"{cms}?labelSelector=team%3Dred&fieldSelector=metadata.name%21%3Dcm-03&limit=2", []),
        diff(wc_sides, "/api/v1/namespaces/INVALID/configmaps", rv0),
        diff(wc_sides, "/api/v1/namespaces/no-such-namespace/pods", rv0),
        diff(wc_sides, "/api/v1/namespaces/no-such-namespace/pods", [("limit", "1")]),
    ]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()


async def test_gzip_as_the_apiserver_gzips(wc_sides: Sides, population: Population) -> None:
    """``Accept-Encoding: gzip`` (client-go and kubectl always send it): the apiserver compresses a
    body over 128 KiB; the same list from the cache should come the same way, and decode the same."""
    b = population.namespaces[1]
    gz = {"Accept-Encoding": "gzip"}
    work = [
        diff(wc_sides, path, p, headers=gz, accept=accept)
        for path in ("/api/v1/configmaps", f"/api/v1/namespaces/{b}/configmaps", "/api/v1/pods")
        for p in ([], [("resourceVersion", "0")], [("limit", "3")])
        for accept in (JSON, PROTOBUF)
    ]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()


async def test_list_conversions_pass_through(wc_sides: Sides, population: Population) -> None:
    """``as=PartialObjectMetadataList`` is answered as the apiserver answers it (JSON and protobuf);
    ``as=Table`` gives the same columns and rows (the Age cell aside, it moves with the clock)."""
    ns = population.namespaces[0]
    path = f"/api/v1/namespaces/{ns}/pods"
    meta = "application/{};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    found = await gather_limited(
        (
            diff(wc_sides, path, p, accept=meta.format(enc))
            for enc in ("json", "vnd.kubernetes.protobuf")
            for p in ([], [("resourceVersion", "0")], [("limit", "7")])
        ),
        CONCURRENCY,
    )
    table = "application/json;as=Table;g=meta.k8s.io;v=v1"
    for p in ([], [("resourceVersion", "0")], [("limit", "7")]):
        full = query_path(path, p)
        direct, proxied = await wc_sides.both("GET", full, accept=table)
        label = f"GET {full} [Accept: {table}]"
        if (direct.status, direct.content_type) != (proxied.status, proxied.content_type):
            found.add(
                label,
                "status, Content-Type",
                (direct.status, direct.content_type),
                (proxied.status, proxied.content_type),
            )
            continue
        dt, pt = _table_without_age(direct.json()), _table_without_age(proxied.json())
        if dt != pt:
            found.add(label, "Table (Age cells and list resourceVersion aside)", dt, pt)
    assert not found, found.report()


def _table_without_age(table: dict[str, Any]) -> dict[str, Any]:
    cols = [c["name"] for c in table.get("columnDefinitions") or []]
    age = cols.index("Age") if "Age" in cols else -1
    rows = [
        ([c for i, c in enumerate(r.get("cells", [])) if i != age], r.get("object")) for r in table.get("rows") or []
    ]
    meta = {k: v for k, v in (table.get("metadata") or {}).items() if k not in ("resourceVersion", "continue")}
    return {"kind": table.get("kind"), "columns": table.get("columnDefinitions"), "rows": rows, "metadata": meta}


# --------------------------------------------------------------------------- paging


async def _page_all(
    sides: Sides, path: str, params: Sequence[tuple[str, str]], *, via_proxy: bool, accept: str = JSON
) -> list[Answer]:
    """Follow continue tokens to the end (bounded), on one side."""
    pages: list[Answer] = []
    token: str | None = None
    while len(pages) < 500:
        p = [*params, *([("continue", token)] if token else [])]
        answer = await sides.request("GET", query_path(path, p), via_proxy=via_proxy, accept=accept)
        pages.append(answer)
        if answer.status != 200:
            break
        token = list_view(answer).continue_token
        if not token:
            break
    return pages


async def _compare_paging(sides: Sides, path: str, params: list[tuple[str, str]], accept: str = JSON) -> Mismatches:
    found = Mismatches()
    label = f"paging GET {query_path(path, params)} [Accept: {accept}]"
    direct = await _page_all(sides, path, params, via_proxy=False, accept=accept)
    proxied = await _page_all(sides, path, params, via_proxy=True, accept=accept)
    if len(direct) != len(proxied):
        found.add(label, "number of pages", len(direct), len(proxied))
    for n, (d, p) in enumerate(zip(direct, proxied, strict=False)):
        found.extend(compare_answers(f"{label} page {n + 1}", d, p, {**dict(params), "continue": "x"}))
    unpaged = [(k, v) for k, v in params if k != "limit"]
    for side, pages in (("apiserver", direct), ("kproxy", proxied)):
        if any(a.status != 200 for a in pages):
            continue
        views = [list_view(a) for a in pages]
        rvs = {v.resource_version for v in views}
        if len(rvs) != 1:
            found.add(label, f"{side}: pages of one list at different resourceVersions", "", sorted(map(str, rvs)))
        union = [item for v in views for item in v.items]
        whole = await sides.request("GET", query_path(path, unpaged), via_proxy=side == "kproxy", accept=accept)
        if whole.status != 200:
            found.add(label, f"{side}: the unpaged list failed", whole.status, whole.body[:300])
            continue
        expect = list_view(whole).items
        if union != expect:
            found.add(
                label,
                f"{side}: the pages' union is not the unpaged list",
                [i["metadata"]["name"] for i in expect],
                [i["metadata"]["name"] for i in union],
            )
    return found


@pytest.mark.parametrize(
    "where,limit",
    [
        ("pods-cluster", "7"),
        ("pods-ns", "1"),
        ("configmaps-cluster", "7"),
        ("secrets-ns", "1"),
        ("pods-cluster", "1000"),
        ("pods-ns", "25"),  # exactly as many as there are: no continue token
        ("pods-ns", "24"),  # one short: a last page of one
    ],
)
async def test_paging_to_the_end(wc_sides: Sides, population: Population, where: str, limit: str) -> None:
    """limit/continue to the end on both sides: page by page the same items, remainingItemCount and
    continue presence; one resourceVersion for all pages; the union is the unpaged list."""
    path = _paths(population)[where]
    found = await _compare_paging(wc_sides, path, [("limit", limit)])
    assert not found, found.report()


@pytest.mark.parametrize("accept", [YAML, PROTOBUF])
async def test_paging_encodings(wc_sides: Sides, population: Population, accept: str) -> None:
    found = await _compare_paging(wc_sides, "/api/v1/configmaps", [("limit", "9")], accept=accept)
    assert not found, found.report()


LABEL_SELECTORS = [
    "app=web",
    "app==web",
    "app!=web",
    "app in (web,db)",
    "app notin (web,db)",
    "app",
    "!app",
    "tier=front,app=web",
    "env in (prod),tier",
    "app=",
    "app>1",
    "team=red",
    "kind=tls",
    "example.com/role=tricky",
    "example.com/role",
    "size notin (big)",
    # invalid: the apiserver's own 400 must come back word for word
    "app=(",
    "app in (web",
    "a b",
    "=web",
    "app=web,",
    "x/y/z=1",
    "app=" + "v" * 64,
]

POD_FIELDS = [
    "spec.nodeName=node-a",
    "spec.nodeName=",
    "spec.nodeName!=node-a",
    "status.phase=Running",
    "status.phase!=Pending,spec.restartPolicy=Never",
    "spec.schedulerName=batch-scheduler",
    "spec.serviceAccountName=builder",
    "spec.hostNetwork=true",
    "spec.hostNetwork=false",
    "spec.restartPolicy==Always",
    "metadata.name=pod-07",
    "metadata.name!=pod-07",
    "status.podIP=10.1.0.2",
    "status.podIPs=10.1.0.2",
    "status.nominatedNodeName=",
    # unsupported and invalid
    "spec.foo=x",
    "metadata.labels.app=web",
    "spec.nodeName",
    "metadata.name in (pod-07)",
]


def _selector_combos(pop: Population, key: str, values: Sequence[str]) -> list[list[tuple[str, str]]]:
    return [
        [(key, v), *_params(pop, rv, None, lim)]
        for v in values
        for rv, lim in itertools.product([None, "0", "recent"], [None, "7"])
    ]


@pytest.mark.parametrize("where", ["pods-cluster", "pods-ns", "configmaps-cluster", "secrets-ns"])
async def test_label_selectors(wc_sides: Sides, population: Population, where: str) -> None:
    """labelSelector (equality, set-based, existence, invalid syntax) with resourceVersion and limit."""
    path = _paths(population)[where]
    combos = _selector_combos(population, "labelSelector", LABEL_SELECTORS)
    found = await gather_limited((diff(wc_sides, path, p) for p in combos), CONCURRENCY)
    assert not found, found.report()


async def test_field_selectors(wc_sides: Sides, population: Population) -> None:
    """fieldSelector: every field the apiserver supports for pods, configmaps and secrets, plus
    unsupported fields and invalid syntax (the apiserver's 400 word for word)."""
    a, b, _ = population.namespaces
    pod_fields = [*POD_FIELDS, f"metadata.namespace={a}", f"metadata.namespace!={a}"]
    cm_fields = ["metadata.name=cm-03", f"metadata.namespace={b}", "data.key0=x", "metadata.name="]
    secret_fields = [
        "type=kubernetes.io/tls",
        "type!=Opaque",
        "metadata.name=basic",
        "type=kubernetes.io/tls,metadata.name=tls-1",
        "data.token=x",
    ]
    work = [
        diff(wc_sides, path, p)
        for path, fields in (
            ("/api/v1/pods", pod_fields),
            (f"/api/v1/namespaces/{a}/pods", POD_FIELDS[:6]),
            ("/api/v1/configmaps", cm_fields),
            ("/api/v1/secrets", secret_fields),
        )
        for p in _selector_combos(population, "fieldSelector", fields)
    ]
    both = [("labelSelector", "app in (web,db)"), ("fieldSelector", "spec.nodeName!=node-b")]
    work += [
        diff(wc_sides, "/api/v1/pods", [*both, *extra]) for extra in ([], [("limit", "3")], [("resourceVersion", "0")])
    ]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()


async def test_paging_with_selectors(wc_sides: Sides, population: Population) -> None:
    """Pages of a filtered list: remainingItemCount is never set with a selector (the apiserver's
    rule), and the pages still add up to the unpaged filtered list."""
    found = Mismatches()
    for params in (
        [("labelSelector", "app in (web,db)"), ("limit", "4")],
        [("fieldSelector", "spec.nodeName=node-a"), ("limit", "3")],
        [("labelSelector", "!tier"), ("fieldSelector", "status.phase!=Running"), ("limit", "5")],
    ):
        found.extend(await _compare_paging(wc_sides, "/api/v1/pods", params))
    assert not found, found.report()


# --------------------------------------------------------------------------- continue tokens


def _token(rv: int, start: str, version: str = "meta.k8s.io/v1") -> str:
    raw = json.dumps({"v": version, "rv": rv, "start": start}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_continue_tokens(wc_sides: Sides, population: Population) -> None:
    """Garbage and foreign tokens, each side's own token combined with resourceVersion and
    resourceVersionMatch, and the apiserver's token handed to kproxy (it passes through)."""
    a = population.namespaces[0]
    path = "/api/v1/pods"
    found = Mismatches()
    first = [("limit", "7")]
    d0 = await wc_sides.request("GET", query_path(path, first), via_proxy=False)
    p0 = await wc_sides.request("GET", query_path(path, first), via_proxy=True)
    dtok, ptok = list_view(d0).continue_token, list_view(p0).continue_token
    assert dtok and ptok, (d0.body[:300], p0.body[:300])

    # Tokens kproxy did not issue: it passes them through, so the apiserver's answer comes back.
    garbage = [
        "garbage",
        _token(population.recent_rv, f"{a}/pod-07\x00", version="meta.k8s.io/v2"),
        _token(population.recent_rv, ""),
        _token(-1, f"{a}/pod-07\x00"),
        _token(population.recent_rv, f"{a}/pod-07\x00"),
        dtok,
    ]
    work = [diff(wc_sides, path, [("limit", "7"), ("continue", t)]) for t in garbage]
    found.extend(await gather_limited(work, CONCURRENCY))

    # A token used on another list than the one that issued it (another namespace, cluster-wide,
    # another resource): each side's own token, the same answer.
    ns_path = f"/api/v1/namespaces/{a}/pods"
    d_ns = list_view(await wc_sides.request("GET", f"{ns_path}?limit=4", via_proxy=False)).continue_token
    p_ns = list_view(await wc_sides.request("GET", f"{ns_path}?limit=4", via_proxy=True)).continue_token
    assert d_ns and p_ns
    b = population.namespaces[1]
    for target, (dt, pt) in (
        ("/api/v1/pods", (d_ns, p_ns)),
        (f"/api/v1/namespaces/{b}/pods", (d_ns, p_ns)),
        ("/api/v1/configmaps", (dtok, ptok)),
        (f"/api/v1/namespaces/{a}/configmaps", (d_ns, p_ns)),
    ):
        d = await wc_sides.request("GET", query_path(target, [("limit", "4"), ("continue", dt)]), via_proxy=False)
        p = await wc_sides.request("GET", query_path(target, [("limit", "4"), ("continue", pt)]), via_proxy=True)
        found.extend(
            compare_answers(f"GET {target}?limit=4&continue=<a token of another list>", d, p, {"continue": "x"})
        )

    # Each side's own token with resourceVersion / resourceVersionMatch: the apiserver's errors
    # (or its "rv=0 is treated as the token" rule) whatever the token's origin.
    for rv, rvm in itertools.product([None, "0", "recent", "not-a-number"], [None, "NotOlderThan", "Exact"]):
        extra = _params(population, rv, rvm, "7")
        d = await wc_sides.request("GET", query_path(path, [*extra, ("continue", dtok)]), via_proxy=False)
        p = await wc_sides.request("GET", query_path(path, [*extra, ("continue", ptok)]), via_proxy=True)
        label = f"GET {query_path(path, [*extra, ('continue', '<each side own token>')])}"
        found.extend(compare_answers(label, d, p, {**dict(extra), "continue": "x"}))

    # kproxy's token handed to the apiserver: refused as the apiserver refuses any bad token, or
    # understood and then continued correctly; never a server error.
    d = await wc_sides.request("GET", query_path(path, [("limit", "7"), ("continue", ptok)]), via_proxy=False)
    p = await wc_sides.request("GET", query_path(path, [("limit", "7"), ("continue", ptok)]), via_proxy=True)
    label = f"GET {path}?limit=7&continue=<kproxy's token> straight to the apiserver"
    if d.status == 200:
        if item_names(list_view(d)) != item_names(list_view(p)):
            found.add(label, "continued list", item_names(list_view(d)), item_names(list_view(p)))
    elif d.status != 400 or d.json().get("reason") != "BadRequest":
        found.add(label, "the apiserver's answer to kproxy's token", d.body[:300], "")
    assert not found, found.report()


# --------------------------------------------------------------------------- GET


async def test_get(wc_sides: Sides, population: Population) -> None:
    """GET of one object with resourceVersion=0 (from the cache), unset and N (pass through), in
    JSON, YAML and protobuf: byte-equal; a missing object's 404 byte-equal."""
    a, b, c = population.namespaces
    targets = [
        *(f"/api/v1/namespaces/{a}/pods/{n}" for n in population.pods[a][:4]),
        *(f"/api/v1/namespaces/{b}/configmaps/{n}" for n in population.configmaps[b][:3]),
        *(f"/api/v1/namespaces/{b}/secrets/{n}" for n in population.secrets[b][:3]),
        *(
            f"/api/v1/namespaces/{b}/configmaps/{n}"
            for n in ("tricky", "big", "yaml-styles", "terminating", "doomed-cm")
        ),
        f"/api/v1/namespaces/{b}/pods/doomed-pod",
        f"/api/v1/namespaces/{c}/secrets/none",
        f"/api/v1/namespaces/{a}/pods/no-such-pod",
        # A name that exists only in the namespaces whose names start with this one's.
        f"/api/v1/namespaces/{a}/pods/{next(n for n in population.pods[b] if n not in population.pods[a])}",
        "/api/v1/namespaces/no-such-namespace/configmaps/x",
    ]
    rvs = [[], [("resourceVersion", "0")], [("resourceVersion", str(population.recent_rv))]]
    work = [
        diff(wc_sides, t, rv, accept=accept, is_list=False)
        for t in targets
        for rv in rvs
        for accept in (JSON, YAML, PROTOBUF)
    ]
    work += [
        diff(wc_sides, targets[0], p, is_list=False)
        for p in (
            [("resourceVersion", "not-a-number")],
            [("resourceVersion", str(FUTURE))],
            [("resourceVersion", "0"), ("pretty", "true")],
            [("resourceVersion", "")],
            [("resourceVersion", "0"), ("resourceVersionMatch", "Exact")],
        )
    ]
    found = await gather_limited(work, CONCURRENCY)
    assert not found, found.report()


# --------------------------------------------------------------------------- served from the cache


async def test_metrics_say_where_reads_were_served(
    wc_sides: Sides, population: Population, cache_proxy: RunningProxy
) -> None:
    """resourceVersion=0 LIST and GET count as served="cache"; an Exact LIST and a continue token
    kproxy did not issue as served="upstream"."""
    a = population.namespaces[0]

    def count(verb: str, served: str) -> float:
        return reads_total(cache_proxy.metrics(), resource="pods", verb=verb, served=served)

    steps: list[tuple[str, str, str, list[tuple[str, str]]]] = [
        ("list", "cache", f"/api/v1/namespaces/{a}/pods", [("resourceVersion", "0")]),
        ("list", "cache", "/api/v1/pods", [("resourceVersion", "0"), ("limit", "3")]),
        ("list", "cache", "/api/v1/pods", []),
        (
            "list",
            "upstream",
            "/api/v1/pods",
            [("resourceVersion", str(population.recent_rv)), ("resourceVersionMatch", "Exact")],
        ),
        ("get", "cache", f"/api/v1/namespaces/{a}/pods/{population.pods[a][0]}", [("resourceVersion", "0")]),
    ]
    direct_token = list_view(await wc_sides.request("GET", "/api/v1/pods?limit=2", via_proxy=False)).continue_token
    assert direct_token
    steps.append(("list", "upstream", "/api/v1/pods", [("limit", "2"), ("continue", direct_token)]))
    wrong: list[str] = []
    for verb, served, path, params in steps:
        before = count(verb, served)
        answer = await wc_sides.request("GET", query_path(path, params), via_proxy=True)
        assert answer.status == 200, answer.body[:300]
        after = count(verb, served)
        if after - before != 1:
            wrong.append(
                f"GET {query_path(path, params)}: reads_total{{verb={verb},served={served}}} {before} -> {after}"
            )
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------- read your writes


async def test_read_your_writes(wc_sides: Sides, control_plane: ControlPlaneInfo, namespace: str) -> None:
    """A write (through kproxy or straight to the apiserver) followed at once by a LIST without
    resourceVersion through kproxy: the write is always in it, at the version the write returned."""
    mismatches: list[str] = []
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    json_ct = {"Content-Type": "application/json"}

    async def write(method: str, target: str, body: dict[str, Any] | None, via_proxy: bool) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        answer = await wc_sides.request(method, target, via_proxy=via_proxy, headers=json_ct, data=data)
        assert answer.status in (200, 201), f"{method} {target}: {answer.status} {answer.body[:300]!r}"
        result: dict[str, Any] = answer.json()
        return result

    async def listed(target: str, selector: str | None = None) -> dict[str, str]:
        q = [("labelSelector", selector)] if selector else []
        answer = await wc_sides.request("GET", query_path(target, q), via_proxy=True)
        assert answer.status == 200, answer.body[:300]
        return {
            f"{i['metadata']['namespace']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"]
            for i in answer.json()["items"]
        }

    def check(what: str, seen: dict[str, str], name: str, rv: str | None) -> None:
        name = f"{namespace}/{name}"
        if rv is None and name in seen:
            mismatches.append(f"{what}: {name} still listed at {seen[name]}")
        elif rv is not None and seen.get(name) != rv:
            mismatches.append(f"{what}: {name} listed at {seen.get(name)}, the write returned {rv}")

    try:
        for i in range(50):
            via = i % 2 == 0
            side = "kproxy" if via else "apiserver"
            name = f"ryw-{i}"
            cm = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {"ryw": namespace, "state": "new"}},
                "data": {"n": "0"},
            }
            created = await write("POST", path, cm, via)
            check(f"#{i} create via {side}", await listed(path), name, created["metadata"]["resourceVersion"])
            cm["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
            cm["data"] = {"n": "1"}
            cm["metadata"]["labels"]["state"] = "updated"
            updated = await write("PUT", f"{path}/{name}", cm, not via)
            check(
                f"#{i} update via {'apiserver' if via else 'kproxy'}",
                await listed(path),
                name,
                updated["metadata"]["resourceVersion"],
            )
            if i % 3 == 1:  # the update moved it from one selector's answer to another's
                rv = updated["metadata"]["resourceVersion"]
                check(f"#{i} update, selector state=updated", await listed(path, "state=updated"), name, rv)
                check(f"#{i} update, selector state=new", await listed(path, "state=new"), name, None)
            if i % 5 == 0:  # the cluster-wide list too
                check(
                    f"#{i} update, cluster-wide",
                    await listed("/api/v1/configmaps", f"ryw={namespace}"),
                    name,
                    updated["metadata"]["resourceVersion"],
                )
            if i % 3 == 0:
                await write("DELETE", f"{path}/{name}", None, via)
                check(f"#{i} delete via {side}", await listed(path), name, None)
                if i % 2 == 0:  # the same name again: a new object, a new uid
                    cm["metadata"].pop("resourceVersion")
                    again = await write("POST", path, cm, not via)
                    check(f"#{i} re-create", await listed(path), name, again["metadata"]["resourceVersion"])
            if i % 4 == 0:
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name},
                    "spec": {"containers": [{"name": "c", "image": "registry.example/app:1"}]},
                }
                made = await write("POST", pods, pod, not via)
                check(f"#{i} pod create", await listed(pods), name, made["metadata"]["resourceVersion"])
                await write("DELETE", f"{pods}/{name}", None, via)
                check(f"#{i} pod delete", await listed(pods), name, None)
    finally:  # no namespace controller here: leftovers would stay in cluster-wide lists
        await wc_sides.request("DELETE", path, via_proxy=False)
    assert not mismatches, "\n".join(mismatches)


async def test_read_your_writes_with_concurrent_writers(wc_sides: Sides, namespace: str) -> None:
    """Six writers at once, each listing (consistently, through kproxy) right after each of its
    writes while the others keep the resource version moving: each sees all of its own writes."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    json_ct = {"Content-Type": "application/json"}
    problems: list[str] = []

    async def writer(k: int) -> None:
        mine: dict[str, str] = {}
        for j in range(8):
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"w{k}-{j}", "labels": {"writer": str(k)}},
            }
            made = await wc_sides.request(
                "POST", path, via_proxy=(j + k) % 2 == 0, headers=json_ct, data=json.dumps(body).encode()
            )
            assert made.status == 201, made.body[:300]
            mine[f"w{k}-{j}"] = made.json()["metadata"]["resourceVersion"]
            listed = await wc_sides.request("GET", query_path(path, [("labelSelector", f"writer={k}")]), via_proxy=True)
            assert listed.status == 200, listed.body[:300]
            seen = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in listed.json()["items"]}
            if seen != mine:
                problems.append(f"writer {k} after write {j}: listed {seen}, wrote {mine}")

    try:
        await asyncio.gather(*(writer(k) for k in range(6)))
    finally:
        await wc_sides.request("DELETE", path, via_proxy=False)
    assert not problems, "\n".join(problems)


async def test_field_selectors_follow_writes(wc_sides: Sides, namespace: str) -> None:
    """Selectable fields that change after creation (status.phase by a status write, spec.nodeName
    by a binding, metadata.name by a delete and re-create) and a delete-collection: a consistent
    list with that field selector through kproxy, right after each write, answers as the apiserver."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    json_ct = {"Content-Type": "application/json"}
    found = Mismatches()

    async def admin(method: str, target: str, body: dict[str, Any] | None, via_proxy: bool = False) -> None:
        ct = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else json_ct
        data = json.dumps(body).encode() if body is not None else None
        answer = await wc_sides.request(method, target, via_proxy=via_proxy, headers=ct, data=data)
        assert answer.status in (200, 201), f"{method} {target}: {answer.body[:300]!r}"

    async def compare(step: str, selectors: list[str]) -> None:
        for sel in selectors:
            m = await diff(wc_sides, pods, [("fieldSelector", sel)])
            found.found.extend(f"after {step}: {f}" for f in m.found)

    spec = {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
    try:
        for n in range(6):
            await admin(
                "POST",
                pods,
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"f-{n}"}, "spec": spec},
                n % 2 == 0,
            )
        await compare("created", ["status.phase=Pending", "spec.nodeName=", "metadata.name=f-3"])
        for n, phase in enumerate(("Running", "Succeeded", "Failed", "Running")):
            await admin("PATCH", f"{pods}/f-{n}/status", {"status": {"phase": phase}})
            await compare(f"phase {phase}", [f"status.phase={phase}", "status.phase!=Pending"])
        for n, node in ((4, "node-x"), (5, "node-y")):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": f"f-{n}"},
                "target": {"kind": "Node", "name": node},
            }
            await admin("POST", f"{pods}/f-{n}/binding", binding)
            await compare(f"bound to {node}", [f"spec.nodeName={node}", "spec.nodeName=", "spec.nodeName!=node-x"])
        await admin("DELETE", f"{pods}/f-3", None, via_proxy=True)
        await compare("f-3 deleted", ["metadata.name=f-3", "metadata.name!=f-3"])
        await admin("POST", pods, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "f-3"}, "spec": spec}, True)
        await compare("f-3 re-created", ["metadata.name=f-3", "status.phase=Pending"])
        answer = await wc_sides.request("DELETE", f"{pods}?fieldSelector=spec.nodeName%3D", via_proxy=True)
        assert answer.status == 200, answer.body[:300]
        await compare("unbound ones deleted", ["spec.nodeName=", "status.phase=Running"])
    finally:
        await wc_sides.request(
            "DELETE", pods, via_proxy=False, headers=json_ct, data=json.dumps({"gracePeriodSeconds": 0}).encode()
        )
    assert not found, found.report()


async def test_paging_is_a_snapshot_across_writes(wc_sides: Sides, namespace: str) -> None:
    """Pages after the first come from the first page's snapshot, as the apiserver's do: objects
    deleted, added or changed between pages do not show (and remainingItemCount does not move)."""
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    json_ct = {"Content-Type": "application/json"}

    async def admin(method: str, target: str, body: dict[str, Any] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else None
        answer = await wc_sides.request(method, target, via_proxy=False, headers=json_ct, data=data)
        assert answer.status in (200, 201), answer.body[:300]

    def cm(name: str, value: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": value}}

    found = Mismatches()
    try:
        for n in range(12):
            await admin("POST", path, cm(f"c-{n:02d}", "before"))
        # A consistent read through kproxy: its cache has all twelve from here on.
        assert (await wc_sides.request("GET", path, via_proxy=True)).status == 200
        pages_d = [await wc_sides.request("GET", f"{path}?limit=5", via_proxy=False)]
        pages_p = [await wc_sides.request("GET", f"{path}?limit=5", via_proxy=True)]
        found.extend(compare_answers(f"GET {path}?limit=5", pages_d[0], pages_p[0], {"limit": "5"}))
        await admin("DELETE", f"{path}/c-07")
        await admin("POST", path, cm("c-06a", "added"))
        await admin("PUT", f"{path}/c-09", cm("c-09", "changed"))
        await admin("DELETE", f"{path}/c-01")  # already on page 1
        for pages, via in ((pages_d, False), (pages_p, True)):
            while (token := list_view(pages[-1]).continue_token) and len(pages) < 10:
                pages.append(
                    await wc_sides.request(
                        "GET", query_path(path, [("limit", "5"), ("continue", token)]), via_proxy=via
                    )
                )
        if len(pages_d) != len(pages_p):
            found.add(f"GET {path}?limit=5 to the end", "number of pages", len(pages_d), len(pages_p))
        for n, (d, p) in enumerate(zip(pages_d[1:], pages_p[1:], strict=False)):
            found.extend(compare_answers(f"GET {path}?limit=5 page {n + 2} after writes", d, p, {"continue": "x"}))
        now = list_view(await wc_sides.request("GET", path, via_proxy=False)).items
        assert [i for a in pages_d for i in list_view(a).items] != now, "the writes did not land between pages"
        # Each side's union is exactly the list at its first page's resourceVersion.
        for side, pages in (("apiserver", pages_d), ("kproxy", pages_p)):
            rv = list_view(pages[0]).resource_version or ""
            union = [i for a in pages for i in list_view(a).items]
            exact = await wc_sides.request(
                "GET", query_path(path, [("resourceVersion", rv), ("resourceVersionMatch", "Exact")]), via_proxy=False
            )
            if union != list_view(exact).items:
                found.add(
                    f"GET {path}?limit=5 to the end",
                    f"{side}: pages are not the list at {rv}",
                    "",
                    [i["metadata"]["name"] for i in union],
                )
    finally:
        await wc_sides.request("DELETE", path, via_proxy=False)
    assert not found, found.report()


async def test_fresh_kproxy_serves_complete_lists(
    control_plane: ControlPlaneInfo, population: Population, wc_sides: Sides, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The first reads a new kproxy answers, the moment it says it is ready: never a partial list
    from a cache still filling (the apiserver answers 429 until its own cache is ready, never that)."""
    rp = start_cache_proxy(tmp_path_factory.mktemp("kproxy-watchcache-fresh"), control_plane)
    sides = Sides(control_plane, rp.url)
    try:
        requests = [
            (f"/api/v1/{r}", p)
            for r in ("pods", "configmaps", "secrets")
            for p in ([("resourceVersion", "0")], [], [("limit", "500")])
        ]
        answers = await asyncio.gather(*(sides.request("GET", query_path(t, p), via_proxy=True) for t, p in requests))
        found = Mismatches()
        for (target, params), got in zip(requests, answers, strict=True):
            label = f"GET {query_path(target, params)} from a kproxy just ready"
            if got.status == 429:
                continue  # "storage is (re)initializing", as the apiserver would say
            # A page (limit) against the apiserver's own page; a whole list against the whole list.
            limit = [(k, v) for k, v in params if k == "limit"]
            want = await sides.request("GET", query_path(target, limit), via_proxy=False)
            if got.status != 200:
                found.add(label, "status", 200, got.body[:300])
            elif item_names(list_view(got)) != item_names(list_view(want)):
                found.add(label, "items", item_names(list_view(want)), item_names(list_view(got)))
    finally:
        await sides.close()
        rp.stop()
    assert any(a.status == 200 for a in answers), "a ready kproxy answered every list with 429"
    assert not found, found.report()


async def test_impersonation_headers_are_honoured(
    control_plane: ControlPlaneInfo, wc_sides: Sides, forward_cache_proxy: RunningProxy, population: Population
) -> None:
    """A request carrying Impersonate-User/-Group is the impersonated user's request: the apiserver
    answers it as that user (here: 403, the user has no RBAC). A cached answer must not ignore the
    headers and serve the caller's (or kproxy's own) view instead; whatever kproxy does (pass the
    request on, or authorize the impersonated identity), the answer must be the apiserver's."""
    a = population.namespaces[0]
    bearer = BearerSides(control_plane, forward_cache_proxy, control_plane.admin_token)
    headers_sets = [
        {"Impersonate-User": control_plane.user_name},
        {"Impersonate-User": control_plane.user_name, "Impersonate-Group": "system:authenticated"},
        {"Impersonate-User": "system:serviceaccount:default:nobody"},
    ]
    try:
        work = [
            diff(sides, path, p, headers=h, is_list=not path.endswith("pod-00"))
            for sides in (wc_sides, bearer)
            for h in headers_sets
            for path in ("/api/v1/pods", f"/api/v1/namespaces/{a}/pods", f"/api/v1/namespaces/{a}/pods/pod-00")
            for p in ([("resourceVersion", "0")], [], [("limit", "2")])
        ]
        found = await gather_limited(work, CONCURRENCY)
    finally:
        await bearer.close()
    assert not found, found.report()


# --------------------------------------------------------------------------- custom resources


async def test_custom_resources(control_plane: ControlPlaneInfo, widgets: Widgets, widget_proxy: RunningProxy) -> None:
    """A CRD's objects (unstructured on both sides: sorted keys, Go's number text, no protobuf, the
    CRD's selectable fields and printer columns) from the cache as from the apiserver."""
    sides = Sides(control_plane, widget_proxy.url)
    cluster, ns = widgets.path(), widgets.path(widgets.namespaces[0])
    try:
        await settle(sides, paths=[cluster])
        before = reads_total(widget_proxy.metrics(), resource=f"{PLURAL}.{GROUP}", verb="list", served="cache")
        rvs = {"recent": str(widgets.recent_rv), "future": str(FUTURE)}
        combos = [
            [*([("resourceVersion", rvs.get(rv, rv))] if rv is not None else []), *extra]
            for rv in (None, "0", "recent", "future", "not-a-number")
            for extra in ([], [("limit", "3")], [("resourceVersionMatch", "Exact")])
        ]
        selectors = [
            [("fieldSelector", f)]
            for f in (
                "spec.color=red",
                "spec.size=3",
                "spec.color!=blue,spec.size=0",
                "metadata.name=w-07",
                "spec.ratio=1",
            )
        ] + [[("labelSelector", sel)] for sel in ("shape=round", "!shape", "shape in (flat,square)", "shape=(")]
        work = [
            diff(sides, path, p, accept=accept)
            for path in (cluster, ns)
            for p in combos
            for accept in (JSON, YAML, PROTOBUF, f"{PROTOBUF}, {JSON}")
        ]
        work += [
            diff(sides, cluster, [*sel, *extra])
            for sel in selectors
            for extra in ([], [("resourceVersion", "0")], [("limit", "2")])
        ]
        name = widgets.names[widgets.namespaces[0]][0]
        work += [
            diff(sides, f"{ns}/{name}", p, accept=accept, is_list=False)
            for p in ([], [("resourceVersion", "0")])
            for accept in (JSON, YAML, PROTOBUF)
        ]
        found = await gather_limited(work, CONCURRENCY)
        found.extend(await _compare_paging(sides, cluster, [("limit", "3")]))
        found.extend(await _compare_paging(sides, cluster, [("limit", "4"), ("fieldSelector", "spec.color!=green")]))
        table = "application/json;as=Table;g=meta.k8s.io;v=v1"
        for p in ([], [("resourceVersion", "0")]):
            direct, proxied = await sides.both("GET", query_path(cluster, p), accept=table)
            if direct.status != proxied.status or _table_without_age(direct.json()) != _table_without_age(
                proxied.json()
            ):
                found.add(
                    f"GET {query_path(cluster, p)} [Accept: {table}]", "Table", direct.body[:300], proxied.body[:300]
                )
        after = reads_total(widget_proxy.metrics(), resource=f"{PLURAL}.{GROUP}", verb="list", served="cache")
    finally:
        await sides.close()
    assert not found, found.report()
    assert after - before >= 10, "the custom resource lists did not come from the cache"


# --------------------------------------------------------------------------- the harness can fail


async def test_harness_finds_differences(wc_sides: Sides, population: Population) -> None:
    """The comparison is not vacuous: fed two answers that differ in each way it checks, it says so;
    fed two answers that differ only where a cache may differ, it does not."""
    a = population.namespaces[0]
    path = f"/api/v1/namespaces/{a}/pods"

    async def direct(params: list[tuple[str, str]], accept: str = JSON) -> Answer:
        return await wc_sides.request("GET", query_path(path, params), via_proxy=False, accept=accept)

    def found(x: Answer, y: Answer, params: dict[str, str]) -> list[str]:
        return compare_answers("self-test", x, y, params).found

    whole, web, paged, too_large, pb = await asyncio.gather(
        direct([]),
        direct([("labelSelector", "app=web")]),
        direct([("limit", "3")]),
        direct([("resourceVersion", str(FUTURE))]),
        direct([], accept=PROTOBUF),
    )
    assert not found(whole, whole, {})
    assert any("item names" in f for f in found(whole, web, {}))
    # One byte of one item changed: the same names, different encoding.
    tampered = Answer(
        whole.status, whole.headers, whole.body.replace(b'"restartPolicy":"Never"', b'"restartPolicy":"Nevr"', 1)
    )
    assert tampered.body != whole.body
    assert any("not byte-equal" in f for f in found(whole, tampered, {}))
    # The list's resourceVersion: only where the request allows it to differ.
    moved = Answer(
        whole.status,
        whole.headers,
        re.sub(rb'^(\{"kind":"PodList","apiVersion":"v1","metadata":\{"resourceVersion":")\d+', rb"\g<1>1", whole.body),
    )
    assert moved.body != whole.body
    assert not found(whole, moved, {"resourceVersion": "0"})
    assert any("consistent read" in f for f in found(whole, moved, {}))
    assert any("Exact" in f for f in found(whole, moved, {"resourceVersion": "5", "resourceVersionMatch": "Exact"}))
    # Paging metadata and Status bodies.
    assert any("continue" in f or "remainingItemCount" in f for f in found(whole, paged, {}))
    assert too_large.status == 504, too_large.body[:300]
    other_current = Answer(504, too_large.headers, re.sub(rb"current: \d+", b"current: 1", too_large.body))
    assert not found(too_large, other_current, {})
    reworded = Answer(504, too_large.headers, too_large.body.replace(b"Too large", b"Too big"))
    assert any("Status body" in f for f in found(too_large, reworded, {}))
    # Protobuf items compared message by message.
    view = list_view(pb)
    assert len(view.raw_items) == len(population.pods[a]) and view.items[0]["metadata"]["namespace"] == a


# --------------------------------------------------------------------------- credentials: forward


async def test_forward_mode_serves_what_the_apiserver_serves(
    control_plane: ControlPlaneInfo, forward_cache_proxy: RunningProxy, population: Population
) -> None:
    """Behind `credentials: forward` (the caller's own token, authorized before anything leaves the
    cache) an allowed caller gets the same answers as straight from the apiserver, from the cache."""
    sides = BearerSides(control_plane, forward_cache_proxy, control_plane.admin_token)
    try:
        await settle(sides)
        before = reads_total(forward_cache_proxy.metrics(), resource="pods", verb="list", served="cache")
        paths = _paths(population)
        combos = [
            _params(population, rv, rvm, lim)
            for rv, rvm, lim in itertools.product(
                [None, "0", "recent", "future", "not-a-number"], [None, "Exact"], [None, "7"]
            )
        ]
        a = population.namespaces[0]
        work = [diff(sides, paths[w], p) for w in ("pods-ns", "configmaps-cluster", "secrets-ns") for p in combos]
        work += [
            diff(
                sides, f"/api/v1/namespaces/{a}/pods/{population.pods[a][1]}", [("resourceVersion", "0")], is_list=False
            )
        ]
        found = await gather_limited(work, CONCURRENCY)
        found.extend(await _compare_paging(sides, paths["pods-cluster"], [("limit", "9")]))
        after = reads_total(forward_cache_proxy.metrics(), resource="pods", verb="list", served="cache")
    finally:
        await sides.close()
    assert not found, found.report()
    assert after - before >= 8, "the forwarded caller's lists did not come from the cache"


async def test_forward_mode_refusals_are_the_apiservers(
    control_plane: ControlPlaneInfo, forward_cache_proxy: RunningProxy, population: Population
) -> None:
    """A caller without RBAC gets the apiserver's 403 word for word, whatever the read (cluster-wide,
    one namespace, resourceVersion 0/unset/N, paged, GET); a token the apiserver rejects its 401."""
    a, b, _ = population.namespaces
    found = Mismatches()
    for token in (control_plane.user_token, "not-a-valid-token"):
        sides = BearerSides(control_plane, forward_cache_proxy, token)
        try:
            work = [
                diff(sides, path, p, is_list=not path.endswith(("pod-00", "tricky")))
                for path in (
                    "/api/v1/pods",
                    f"/api/v1/namespaces/{a}/pods",
                    f"/api/v1/namespaces/{b}/secrets",
                    "/api/v1/configmaps",
                    f"/api/v1/namespaces/{a}/pods/pod-00",
                    f"/api/v1/namespaces/{b}/configmaps/tricky",
                )
                for p in ([], [("resourceVersion", "0")], [("limit", "7")], _params(population, "recent", None, None))
            ]
            found.extend(await gather_limited(work, CONCURRENCY))
            statuses = {(await sides.request("GET", "/api/v1/pods?resourceVersion=0", via_proxy=True)).status}
        finally:
            await sides.close()
        expected = {403} if token == control_plane.user_token else {401}
        if statuses != expected:
            found.add(f"GET /api/v1/pods?resourceVersion=0 as {token[:8]}...", "status", expected, statuses)
    assert not found, found.report()
