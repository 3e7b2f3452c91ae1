"""Pure logic behind the connection bounds and the bounded metric labels (the behaviour itself is
tested end to end in tests/e2e/test_edge_limits.py and tests/e2e/test_metrics_labels.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from kproxy.config import ConnectionsConfig, parse_config
from kproxy.core.discovery import Discovery, from_aggregated, read_discovery
from kproxy.core.requestinfo import request_info_from_target
from kproxy.server.connections import Connections
from kproxy.server.metrics import Metrics
from kproxy.server.servedresources import OTHER, REFRESH_INTERVAL, ServedResources


class _Conn:
    def __init__(self, conns: Connections, held: int = 0) -> None:
        self.conns = conns
        self.held = held
        self.closed: str | None = None

    def close_for(self, reason: str) -> None:
        self.closed = reason
        self.conns.end_head(self)
        self.conns.held -= self.held
        self.held = 0


def test_defaults_are_the_apiservers_and_keys_parse() -> None:
    assert ConnectionsConfig().read_header_timeout == 32.0  # secure_serving.go ReadHeaderTimeout
    assert ConnectionsConfig().idle_timeout == 90.0  # IdleTimeout
    cfg = parse_config({"connections": {"read_header_timeout": "1.5s", "max_unfinished_heads": 0}})
    assert cfg.connections.read_header_timeout == 1.5 and cfg.connections.max_unfinished_heads == 0


def test_the_connection_reading_longest_is_closed_first() -> None:
    conns = Connections(ConnectionsConfig(max_unfinished_heads=2))
    a, b, c = (_Conn(conns) for _ in range(3))
    for conn in (a, b, c):
        conns.start_head(conn)
    assert (a.closed, b.closed, c.closed) == ("max_unfinished_heads", None, None)
    assert list(conns.reading) == [b, c]


def test_bytes_over_the_budget_close_readers_oldest_first_then_a_served_connection_itself() -> None:
    conns = Connections(ConnectionsConfig(max_unfinished_head_bytes=100))
    old, new = _Conn(conns), _Conn(conns)
    conns.start_head(old)
    conns.start_head(new)
    old.held = 60
    conns.hold(old, 60)
    new.held = 60
    conns.hold(new, 60)
    assert (old.closed, new.closed, conns.held) == ("max_unfinished_head_bytes", None, 60)
    served = _Conn(conns, held=50)  # heads pipelined behind a request being served
    conns.hold(served, 50)
    assert (served.closed, new.closed, conns.held) == ("max_unfinished_head_bytes", None, 60)


def test_unbounded_when_zero() -> None:
    conns = Connections(ConnectionsConfig(max_unfinished_heads=0, max_unfinished_head_bytes=0))
    many = [_Conn(conns, held=1 << 30) for _ in range(100)]
    for conn in many:
        conns.start_head(conn)
        conns.hold(conn, conn.held)
    assert not any(conn.closed for conn in many)


def test_labels_are_known_verbs_and_served_resources_else_other() -> None:
    m = Metrics()
    m.served.known = frozenset({"configmaps", "deployments.apps", "pods", "pods/status", "deployments/scale.apps"})

    def labels(method: str, target: str) -> tuple[str, str, str, str]:
        return m.labels_for(request_info_from_target(method, target))

    # verb, group, resource, subresource: apiserver_request_total's label names.
    assert labels("GET", "/api/v1/namespaces/a/configmaps") == ("list", "", "configmaps", "")
    assert labels("GET", "/apis/apps/v1/namespaces/a/deployments/x") == ("get", "apps", "deployments", "")
    assert labels("PUT", "/apis/apps/v1/namespaces/a/deployments/x/scale") == ("update", "apps", "deployments", "scale")
    assert labels("GET", "/api/v1/namespaces/a/pods/x/status") == ("get", "", "pods", "status")
    assert labels("GET", "/api/v1/namespaces/a/pods/x/r4nd0m") == ("get", "", "pods", OTHER)
    assert labels("GET", "/version") == ("get", "", "", "")  # a non-resource request
    assert labels("PROPFIND", "/api/v1/namespaces/a/r123") == (OTHER, "", OTHER, "")
    assert labels("GET", "/apis/example/v1/deployments") == ("list", "", OTHER, "")
    for i in range(500):
        info = request_info_from_target("GET", f"/api/v1/random{i}/x/y{i}")
        m.count(info, 404, "upstream")
        m.observe_latency(info, "upstream", 0.001)
    assert len(m._counts) == 1 and len(m._latencies) == 1


_AGGREGATED: dict[str, Any] = {
    "/api": {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {
                "metadata": {"creationTimestamp": None},
                "versions": [
                    {"version": "v1", "resources": [{"resource": "pods", "subresources": [{"subresource": "log"}]}]}
                ],
            }
        ],
    },
    "/apis": {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [{"resource": "deployments"}]}]}
        ],
    },
}
_LEGACY: dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {"resources": [{"name": "pods"}, {"name": "pods/log"}]},
    "/apis": {"kind": "APIGroupList", "groups": [{"name": "apps", "versions": [{"groupVersion": "apps/v1"}]}]},
    "/apis/apps/v1": {"resources": [{"name": "deployments"}, {"name": "deployments/scale"}]},
}


def test_discovery_aggregated_and_legacy_give_the_same_labels() -> None:
    assert {r.label for r in from_aggregated(_AGGREGATED["/apis"])} == {"deployments.apps"}
    # Subresources as ``resource/subresource[.group]``: a request's resource never holds a "/".
    for docs in (_AGGREGATED, _LEGACY):

        async def fetch(path: str, accept: str, docs: dict[str, Any] = docs) -> tuple[int, Any]:
            return 200, docs[path]

        found = asyncio.run(read_discovery(fetch))
        assert {label for r in found for label in r.labels()} == {"pods", "pods/log", "deployments.apps"} | (
            {"deployments/scale.apps"} if docs is _LEGACY else set()
        )


class _DiscoveryApi:
    """kproxy's own line as the discovery reader uses it: JSON GETs of the documents below."""

    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs
        self.reads: list[str] = []
        self.rtt = None

    async def json(self, method: str, target: str, body: Any = None, **_: Any) -> tuple[int, Any]:
        self.reads.append(target)
        await asyncio.sleep(0)  # an answer takes a moment: others arrive meanwhile
        return 200, self.docs[target]

    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not used")


def test_a_resource_not_known_yet_reads_discovery_again_at_most_once_per_interval() -> None:
    api = _DiscoveryApi(
        {
            "/api": {"kind": "APIGroupDiscoveryList", "items": []},
            "/apis": {"kind": "APIGroupDiscoveryList", "items": []},
        }
    )
    reads = api.reads

    async def run() -> None:
        discovery = Discovery(api)
        served = ServedResources()
        served.start(discovery)
        await asyncio.sleep(0.01)
        assert reads == ["/api", "/apis"]
        api.docs["/apis"] = _AGGREGATED["/apis"]  # a new resource appears
        assert served.label("deployments.apps") == OTHER
        await asyncio.sleep(0.01)
        assert len(reads) == 2  # read less than REFRESH_INTERVAL ago: not again
        discovery._last -= REFRESH_INTERVAL
        for i in range(100):  # random names: one read between them all
            assert served.label(f"r{i}") == OTHER
        await asyncio.sleep(0.01)
        assert len(reads) == 4
        assert served.label("deployments.apps") == "deployments.apps"
        await served.stop()
        await discovery.close()

    asyncio.run(run())


def test_readers_that_wait_together_share_one_discovery_read_started_after_them() -> None:
    api = _DiscoveryApi(_AGGREGATED)

    async def run() -> None:
        discovery = Discovery(api)
        first = await discovery.read()
        assert len(api.reads) == 2 and {r.label for r in first} == {"pods", "deployments.apps"}
        await asyncio.gather(*(discovery.read() for _ in range(10)))
        # One read in flight, then one more shared by the nine that arrived while it ran.
        assert len(api.reads) == 2 + 2 * 2
        # A reader content with the read under way (the metrics' first read) takes that one.
        await asyncio.gather(discovery.read(), discovery.read(fresh=False))
        assert len(api.reads) == 2 + 2 * 2 + 2
        await discovery.close()

    asyncio.run(run())
