"""The watch cache and the edges of a request's parsing, against the apiserver's own answers.

What the apiserver refuses before (or instead of) reading its cache must not be served from
kproxy's: integers outside int64 (``limit``, ``timeoutSeconds``: ``strconv.ParseInt``'s 400), a
``timeout`` that is not a Go duration (the request-deadline filter's 400, list and get; watches,
being long-running, ignore it), a GET of a name that is not a path segment (the registry's 400
``Name parameter invalid``), a watch of one object whose own field selector does not require that
name (400 ``fieldSelector metadata.name doesn't match requested name``), YAML of an object
go-yaml cannot read (the apiserver's 500 Status). A list of one name is one storage key, never
paginated; a huge watch ``timeoutSeconds`` lasts what Go's wrapped ``time.Duration`` makes of
it. Every request is sent
straight to the apiserver and through kproxy (watch cache on pods, configmaps, secrets) and the
answers compared by :mod:`watchcache_diff`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from corpus.compare import Answer, Sides
from watchcache_diff import YAML, Mismatches, compare_answers, diff, gather_limited, query_path, reads_total
from watchcache_population import settle, start_cache_proxy
from yarl import URL

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

NAMES = ("cm-a", "cm-b", "cm-c")


@pytest.fixture(scope="module")
def edge_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_cache_proxy(tmp_path_factory.mktemp("kproxy-watchcache-edges"), control_plane)
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def edge_ns(control_plane: ControlPlaneInfo, edge_proxy: RunningProxy) -> Iterator[str]:
    """A namespace with three configmaps (one labelled), made after kproxy started."""
    ns = f"wc-edges-{int(time.time() * 1000) % 10**8}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    code, resp = control_plane.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
    assert code == 201, resp[:300]
    for i, name in enumerate(NAMES):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": str(i)}}
        if i == 0:
            cm["metadata"] = {"name": name, "labels": {"app": "web"}}
        code, resp = control_plane.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=json.dumps(cm).encode())
        assert code == 201, resp[:300]
    yield ns
    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
async def edge_sides(control_plane: ControlPlaneInfo, edge_proxy: RunningProxy, edge_ns: str) -> AsyncIterator[Sides]:
    s = Sides(control_plane, edge_proxy.url)
    await settle(s, paths=[f"/api/v1/namespaces/{edge_ns}/configmaps"])
    yield s
    await s.close()


def _served(rp: RunningProxy, verb: str) -> float:
    return reads_total(rp.metrics(), resource="configmaps", verb=verb, served="cache")


async def test_integers_outside_int64(edge_sides: Sides, edge_ns: str, edge_proxy: RunningProxy) -> None:
    """``limit`` and ``timeoutSeconds`` one past int64 either way: the apiserver's 400 ``value out
    of range`` (list and watch); the bounds themselves are lists like any other."""
    path = f"/api/v1/namespaces/{edge_ns}/configmaps"
    out_of_range = [
        [("limit", "9999999999999999999")],
        [("limit", "9223372036854775808"), ("resourceVersion", "0")],
        [("limit", "-9223372036854775809")],
        [("timeoutSeconds", "9999999999999999999"), ("resourceVersion", "0")],
        [("watch", "1"), ("timeoutSeconds", "9223372036854775808")],
        [("watch", "1"), ("timeoutSeconds", "-9223372036854775809"), ("resourceVersion", "0")],
    ]
    bounds = [
        [("limit", "9223372036854775807")],
        [("limit", "-9223372036854775808"), ("resourceVersion", "0")],
        [("timeoutSeconds", "9223372036854775807"), ("resourceVersion", "0")],
    ]
    before = _served(edge_proxy, "list")
    found = await gather_limited(
        [diff(edge_sides, path, p, is_list=False) for p in out_of_range] + [diff(edge_sides, path, p) for p in bounds],
        8,
    )
    assert not found, found.report()
    assert _served(edge_proxy, "list") - before >= len(bounds), "the in-range lists were not served from the cache"


async def test_timeout_parameter_is_a_go_duration(edge_sides: Sides, edge_ns: str, edge_proxy: RunningProxy) -> None:
    """``timeout`` on a list or get: not a Go duration -> the request-deadline filter's 400 (before
    any handler); a valid one (also ``0``, negative, fractions, µs) -> the ordinary answer."""
    path = f"/api/v1/namespaces/{edge_ns}/configmaps"
    bad = ["abc", "5", "1m1", ".s", "1sm", "00", "9999999999999999999ns"]
    good = ["0", "-1s", "1.s", ".5m", "1h2m3.5s", "100\u00b5s0.5h", "30s"]
    work = []
    for t in bad:
        work += [
            diff(edge_sides, path, [("timeout", t), ("resourceVersion", "0")], is_list=False),
            diff(edge_sides, path, [("timeout", t)], is_list=False),
            diff(edge_sides, f"{path}/{NAMES[0]}", [("timeout", t), ("resourceVersion", "0")], is_list=False),
        ]
    work += [diff(edge_sides, path, [("timeout", t), ("resourceVersion", "0")]) for t in good]
    work += [diff(edge_sides, f"{path}/{NAMES[1]}", [("timeout", "30s"), ("resourceVersion", "0")], is_list=False)]
    before = _served(edge_proxy, "list")
    found = await gather_limited(work, 8)
    assert not found, found.report()
    assert _served(edge_proxy, "list") - before >= len(good), (
        "lists with a valid timeout were not served from the cache"
    )


async def test_lists_of_one_name_are_one_key(edge_sides: Sides, edge_ns: str, edge_proxy: RunningProxy) -> None:
    """A list whose field selector requires ``metadata.name`` (in a namespace, or cluster-wide with
    a ``metadata.namespace`` term) is read by the registry as one storage key: never paginated, so
    ``limit=1`` gives no continue token; cluster-wide without the namespace term it is an ordinary
    paginated list. Same items, same continue presence as the apiserver, from the cache."""
    ns_path = f"/api/v1/namespaces/{edge_ns}/configmaps"
    one = f"metadata.name={NAMES[0]}"
    selectors = [
        (ns_path, [("fieldSelector", one)]),
        (ns_path, [("fieldSelector", f"metadata.name=={NAMES[1]}")]),
        (ns_path, [("fieldSelector", one), ("labelSelector", "app=web")]),
        (ns_path, [("fieldSelector", f"{one},metadata.namespace={edge_ns}")]),
        (ns_path, [("fieldSelector", "metadata.name=no-such-name")]),
        (ns_path, [("fieldSelector", f"metadata.name!={NAMES[0]}")]),
        ("/api/v1/configmaps", [("fieldSelector", f"{one},metadata.namespace={edge_ns}")]),
        ("/api/v1/configmaps", [("fieldSelector", f"metadata.namespace={edge_ns},{one}")]),
        ("/api/v1/configmaps", [("fieldSelector", one)]),  # no namespace: an ordinary paginated list
    ]
    rvs: list[list[tuple[str, str]]] = [
        [],
        [("resourceVersion", "0")],
        [("resourceVersion", "1"), ("resourceVersionMatch", "NotOlderThan")],
    ]
    before = _served(edge_proxy, "list")
    work = [diff(edge_sides, path, [*sel, *rv, ("limit", "1")]) for path, sel in selectors for rv in rvs]
    found = await gather_limited(work, 8)
    assert not found, found.report()
    assert _served(edge_proxy, "list") - before >= len(work), "the lists were not all served from the cache"


async def _raw_get(sides: Sides, path: str, via_proxy: bool) -> Answer:
    """A GET whose path is sent as written (no ``.``/``..`` normalisation by the client)."""
    url = URL(sides.url(path, via_proxy), encoded=True)
    async with sides.session(via_proxy).get(url, headers={"Accept": "application/json"}) as resp:
        return Answer(resp.status, resp.headers, await resp.read())


async def test_get_of_a_name_that_is_not_a_path_segment(edge_sides: Sides, edge_ns: str) -> None:
    """GET ``resourceVersion=0`` of ``a%b``, ``..`` and ``.`` (sent as written): the apiserver's
    400 ``Name parameter invalid``, not a 404."""
    path = f"/api/v1/namespaces/{edge_ns}/configmaps"
    names = ["a%25b", "cm-a%25", "%25", "..", ".", "%2E%2E", "%2E"]
    found = Mismatches()
    for name in names:
        for query in ("?resourceVersion=0", ""):
            full = f"{path}/{name}{query}"
            direct, proxied = await asyncio.gather(_raw_get(edge_sides, full, False), _raw_get(edge_sides, full, True))
            if direct.status != 400:
                found.add(f"GET {full}", "harness: the apiserver's 400", 400, direct.status)
            found.extend(compare_answers(f"GET {full}", direct, proxied, {}, is_list=False))
    assert not found, found.report()


async def test_watch_of_one_object_with_a_field_selector(
    edge_sides: Sides, edge_ns: str, edge_proxy: RunningProxy
) -> None:
    """``/watch/namespaces/NS/configmaps/NAME`` with a field selector of its own: it must require
    ``metadata.name=NAME`` (the apiserver's 400 otherwise); when it does, the events are the
    apiserver's, served from the cache."""
    name = NAMES[0]
    path = f"/api/v1/watch/namespaces/{edge_ns}/configmaps/{name}"
    t = [("timeoutSeconds", "1")]
    refused = [
        f"metadata.namespace={edge_ns}",
        "metadata.name=cm-b",
        f"metadata.name!={name}",
        f"metadata.name!=cm-b,metadata.namespace={edge_ns}",
        f"metadata.name=cm-b,metadata.name={name}",  # the first term in sorted order decides
    ]
    accepted = [
        f"metadata.name={name}",
        f"metadata.name=={name}",
        f"metadata.name={name},metadata.namespace={edge_ns}",
        f"metadata.name={name},metadata.name=cm-b",
        "",
    ]
    before = _served(edge_proxy, "watch")
    work = [diff(edge_sides, path, [*t, ("fieldSelector", f)], is_list=False) for f in refused]
    work += [diff(edge_sides, path, [*t, ("fieldSelector", f)], is_list=False) for f in accepted]
    work += [diff(edge_sides, path, [*t, ("labelSelector", "app=web")], is_list=False)]
    found = await gather_limited(work, 8)
    assert not found, found.report()
    served = _served(edge_proxy, "watch") - before
    assert served >= len(accepted) + 1, f"only {served} of the accepted watches were served from the cache"


async def _watch_lasts(sides: Sides, path: str, via_proxy: bool) -> tuple[int, float, int]:
    """(status, seconds until the stream ended, bytes): bounded at 20 s."""
    start = time.monotonic()
    got = 0
    async with sides.session(via_proxy).get(
        sides.url(path, via_proxy), headers={"Accept": "application/json"}, timeout=aiohttp.ClientTimeout(total=20)
    ) as resp:
        async for chunk in resp.content.iter_any():
            got += len(chunk)
        return resp.status, time.monotonic() - start, got


async def test_watch_timeout_seconds_wraps_as_go_does(
    edge_sides: Sides, edge_ns: str, edge_proxy: RunningProxy
) -> None:
    """``time.Duration(timeoutSeconds) * time.Second`` wraps around int64: 18446744074 s is 0.29 s
    to the apiserver, 9999999999 s and 9223372036854775807 s are negative (the watch ends at once).
    kproxy's watches end when the apiserver's do, not in centuries."""
    base = f"/api/v1/namespaces/{edge_ns}/configmaps"
    before = _served(edge_proxy, "watch")
    for seconds in ("18446744074", "9999999999", "9223372036854775807"):
        path = query_path(base, [("watch", "1"), ("resourceVersion", "0"), ("timeoutSeconds", seconds)])
        (ds, dt, _), (ps, pt, _) = await asyncio.gather(
            _watch_lasts(edge_sides, path, False), _watch_lasts(edge_sides, path, True)
        )
        assert (ds, ps) == (200, 200), (seconds, ds, ps)
        assert dt < 5, f"harness: the apiserver's watch with timeoutSeconds={seconds} lasted {dt:.2f} s"
        assert pt < 5, f"kproxy's watch with timeoutSeconds={seconds} lasted {pt:.2f} s (the apiserver's {dt:.2f} s)"
    # The one that wraps to a positive duration is served from the cache (the others pass through).
    assert _served(edge_proxy, "watch") - before >= 1


async def test_yaml_the_apiserver_cannot_write(
    edge_sides: Sides, namespace: str, control_plane: ControlPlaneInfo, edge_proxy: RunningProxy
) -> None:
    """Objects holding characters go-yaml's reader refuses (DEL, a C1 control, U+FFFE): the
    apiserver's YAML writer fails, and it answers a 500 Status (no reason) in YAML, for GET and
    LIST; JSON is unaffected, and so is a NEL in a value. kproxy answers the same from its cache."""
    odd = {
        "del": {"k": "a\x7fb"},
        "c1": {"k": "a\x9bb"},
        "fffe": {"k": "a\ufffeb"},
        "nel-value": {"k": "a\x85b"},  # a line break in a quoted value: written
    }
    for name, data in odd.items():
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        code, resp = control_plane.request(
            "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(cm).encode()
        )
        assert code == 201, resp[:300]
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    try:
        await _diff_unwritable_yaml(edge_sides, edge_proxy, path, list(odd))
    finally:
        # Namespaces never finish deleting here (no namespace controller): an object no YAML
        # reader takes must not outlive the test, or later tests' `kubectl get -A -o yaml` break.
        for name in odd:
            control_plane.request("DELETE", f"{path}/{name}")


async def _diff_unwritable_yaml(edge_sides: Sides, edge_proxy: RunningProxy, path: str, odd: list[str]) -> None:
    await settle(edge_sides, paths=[path])
    before = _served(edge_proxy, "get") + _served(edge_proxy, "list")
    work = [
        diff(edge_sides, f"{path}/{name}", [("resourceVersion", "0")], accept=accept, is_list=False)
        for name in odd
        for accept in (YAML, "application/json")
    ]
    work += [diff(edge_sides, path, p, accept=YAML, is_list=False) for p in ([], [("resourceVersion", "0")])]
    work += [
        diff(edge_sides, path, [("limit", "2"), ("fieldSelector", f"metadata.name={name}")], accept=YAML, is_list=False)
        for name in ("del", "nel-value")
    ]
    found = await gather_limited(work, 8)
    assert not found, found.report()
    served = _served(edge_proxy, "get") + _served(edge_proxy, "list") - before
    assert served >= len(work), f"only {served} of {len(work)} reads were served from the cache"
