"""Real clients through the watch cache: kubectl and the official Python client get, through kproxy,
what they get straight from the apiserver.

The same population as test_watchcache_list (its own copy, module-scoped), the same kproxy
configuration; each client runs once against the apiserver and once against kproxy, and the
outputs are compared. kproxy's metrics show that the cache, not the upstream, answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from corpus.compare import Sides
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from watchcache_diff import load_yaml, reads_total
from watchcache_population import Population, cache_proxy, population, wc_sides

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.proxyproc import RunningProxy

__all__ = ["cache_proxy", "population", "wc_sides"]  # module-scoped fixtures used here


def _served(rp: RunningProxy, resource: str, verb: str = "list") -> float:
    return reads_total(rp.metrics(), resource=resource, verb=verb, served="cache")


# --------------------------------------------------------------------------- kubectl


def _without_age(table: str) -> list[list[str]]:
    """kubectl's table output, split into cells, without the AGE column (it moves with the clock)."""
    lines = [line.split() for line in table.splitlines() if line.strip()]
    if not lines or "AGE" not in lines[0]:
        return lines
    age = lines[0].index("AGE")
    return [[c for i, c in enumerate(row) if i != age] for row in lines]


def _items(doc: str) -> list[Any]:
    parsed = load_yaml(doc)
    assert parsed["kind"] == "List", parsed.get("kind")
    items: list[Any] = parsed["items"]
    return items


KUBECTL_CASES: list[tuple[str, list[str], Callable[[str], Any]]] = [
    ("pods -A", ["get", "pods", "-A"], _without_age),
    ("pods -A -o yaml", ["get", "pods", "-A", "-o", "yaml"], _items),
    ("pods -A -l", ["get", "pods", "-A", "-l", "app in (web,db),!tier", "-o", "yaml"], _items),
    ("pods -A -l table", ["get", "pods", "-A", "-l", "app=web", "--show-labels"], _without_age),
    ("pods --field-selector", ["get", "pods", "-A", "--field-selector", "spec.nodeName=node-a", "-o", "yaml"], _items),
    (
        "pods --field-selector status.phase",
        ["get", "pods", "-A", "--field-selector", "status.phase!=Pending,spec.restartPolicy=Never", "-o", "name"],
        str,
    ),
    ("pods --chunk-size=5", ["get", "pods", "-A", "--chunk-size=5", "-o", "yaml"], _items),
    ("pods --chunk-size=5 table", ["get", "pods", "-A", "--chunk-size=5"], _without_age),
    ("configmaps --chunk-size=10 -o json", ["get", "configmaps", "-A", "--chunk-size=10", "-o", "json"], _items),
    ("secrets -o yaml", ["get", "secrets", "-A", "--field-selector", "type=kubernetes.io/tls", "-o", "yaml"], _items),
]


@pytest.mark.parametrize("case", [c[0] for c in KUBECTL_CASES])
def test_kubectl_get(
    case: str, kubectl: Kubectl, cache_proxy: RunningProxy, population: Population, wc_sides: Sides
) -> None:
    """``kubectl get`` (tables, -o yaml/json/name, -l, --field-selector, --chunk-size) through kproxy
    prints what it prints straight from the apiserver."""
    _, args, normalise = next(c for c in KUBECTL_CASES if c[0] == case)
    direct = kubectl(args)
    proxied = kubectl(args, kubeconfig=cache_proxy.kubeconfig)
    assert normalise(proxied.stdout) == normalise(direct.stdout)
    assert proxied.stderr == direct.stderr


def test_kubectl_namespaced_and_single_objects(
    kubectl: Kubectl, cache_proxy: RunningProxy, population: Population, wc_sides: Sides
) -> None:
    a, b, c = population.namespaces
    for args in (
        ["get", "pods", "-n", a, "-o", "yaml"],
        ["get", "configmaps", "-n", b, "-o", "yaml", "--chunk-size=2"],
        ["get", "secrets", "-n", c, "-o", "yaml"],  # none: an empty List
        ["get", "pod", population.pods[a][0], "-n", a, "-o", "yaml"],
        ["get", "configmap", "tricky", "big", "-n", b, "-o", "yaml"],
    ):
        direct = kubectl(args)
        proxied = kubectl(args, kubeconfig=cache_proxy.kubeconfig)
        assert load_yaml(proxied.stdout) == load_yaml(direct.stdout), args


def test_kubectl_errors(kubectl: Kubectl, cache_proxy: RunningProxy, population: Population, wc_sides: Sides) -> None:
    """Bad selectors and a missing object: the same exit code and the same message."""
    a = population.namespaces[0]
    for args in (
        ["get", "pods", "-A", "--field-selector", "spec.foo=x"],
        ["get", "pods", "-A", "--field-selector", "spec.nodeName"],
        ["get", "pods", "-A", "-l", "app=("],
        ["get", "pods", "no-such-pod", "-n", a],
        ["get", "configmaps", "-A", "--field-selector", "data.key0=x", "-o", "yaml"],
    ):
        direct = kubectl(args, check=False)
        proxied = kubectl(args, kubeconfig=cache_proxy.kubeconfig, check=False)
        assert (proxied.returncode, proxied.stderr, proxied.stdout) == (
            direct.returncode,
            direct.stderr,
            direct.stdout,
        ), args
        assert direct.returncode != 0, args


def test_kubectl_lists_are_served_from_the_cache(
    kubectl: Kubectl, cache_proxy: RunningProxy, population: Population, wc_sides: Sides
) -> None:
    """kubectl's lists (limit=500, or --chunk-size pages with continue) are consistent reads the
    cache answers: every page counts as served from the cache."""
    before = _served(cache_proxy, "pods")
    out = kubectl(["get", "pods", "-A", "--chunk-size=7", "-o", "name"], kubeconfig=cache_proxy.kubeconfig)
    pages = -(-len(out.stdout.splitlines()) // 7)
    assert _served(cache_proxy, "pods") - before >= pages >= 9


# --------------------------------------------------------------------------- the official Python client


@pytest.fixture(scope="module")
def apis(
    control_plane: ControlPlaneInfo, cache_proxy: RunningProxy
) -> Iterator[tuple[client.CoreV1Api, client.CoreV1Api]]:
    """(straight to the apiserver as admin, through kproxy)."""
    direct = config.new_client_from_config(config_file=str(control_plane.admin_kubeconfig))
    cfg = client.Configuration()
    cfg.host = cache_proxy.url
    proxied = client.ApiClient(cfg)
    with direct, proxied:
        yield client.CoreV1Api(direct), client.CoreV1Api(proxied)


def _plain(api: client.CoreV1Api, obj: Any) -> Any:
    return api.api_client.sanitize_for_serialization(obj)


def _page_all(list_call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[list[Any], int]:
    items: list[Any] = []
    token: str | None = None
    pages = 0
    while True:
        result = list_call(*args, _continue=token, **kwargs) if token else list_call(*args, **kwargs)
        pages += 1
        items.extend(result.items)
        token = result.metadata._continue
        if not token or pages > 200:
            return items, pages


def test_python_client_lists(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], population: Population, wc_sides: Sides
) -> None:
    """list_namespaced_pod / list_pod_for_all_namespaces / configmaps / secrets with label and field
    selectors and resource_version="0": the same objects through kproxy as straight."""
    direct, proxied = apis
    a, b, _ = population.namespaces
    calls: list[tuple[str, dict[str, Any]]] = [
        ("list_namespaced_pod", {"namespace": a}),
        ("list_namespaced_pod", {"namespace": a, "label_selector": "app=web"}),
        ("list_namespaced_pod", {"namespace": a, "label_selector": "tier", "field_selector": "spec.nodeName="}),
        ("list_namespaced_pod", {"namespace": a, "field_selector": "status.phase=Running"}),
        ("list_namespaced_pod", {"namespace": a, "resource_version": "0"}),
        ("list_namespaced_pod", {"namespace": a, "resource_version": "0", "label_selector": "app!=db"}),
        (
            "list_pod_for_all_namespaces",
            {"resource_version": "0", "field_selector": "spec.schedulerName=batch-scheduler"},
        ),
        (
            "list_pod_for_all_namespaces",
            {"resource_version": str(population.recent_rv), "resource_version_match": "NotOlderThan"},
        ),
        ("list_namespaced_config_map", {"namespace": b, "label_selector": "team in (red,blue)"}),
        ("list_config_map_for_all_namespaces", {"resource_version": "0", "label_selector": "example.com/role"}),
        ("list_secret_for_all_namespaces", {"field_selector": "type=kubernetes.io/tls"}),
        ("list_namespaced_secret", {"namespace": b, "resource_version": "0"}),
    ]
    for name, kwargs in calls:
        want = getattr(direct, name)(**kwargs)
        got = getattr(proxied, name)(**kwargs)
        assert _plain(proxied, got.items) == _plain(direct, want.items), (name, kwargs)
        assert got.kind == want.kind and got.api_version == want.api_version


def test_python_client_paging(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], population: Population, wc_sides: Sides
) -> None:
    """limit/_continue paging to the end: the same pages and the same union as one unpaged list."""
    direct, proxied = apis
    a, b, _ = population.namespaces
    for call, args, kwargs in (
        ("list_namespaced_pod", (a,), {"limit": 4}),
        ("list_namespaced_pod", (a,), {"limit": 3, "label_selector": "app"}),
        ("list_pod_for_all_namespaces", (), {"limit": 9}),
        ("list_namespaced_config_map", (b,), {"limit": 1}),
    ):
        want, want_pages = _page_all(getattr(direct, call), *args, **kwargs)
        got, got_pages = _page_all(getattr(proxied, call), *args, **kwargs)
        assert (got_pages, _plain(proxied, got)) == (want_pages, _plain(direct, want)), (call, kwargs)
        whole = getattr(proxied, call)(*args, **{k: v for k, v in kwargs.items() if k != "limit"})
        assert _plain(proxied, whole.items) == _plain(proxied, got)


def test_python_client_errors(apis: tuple[client.CoreV1Api, client.CoreV1Api], population: Population) -> None:
    """Invalid selectors and resource versions raise the same ApiException with the same body."""
    direct, proxied = apis
    a = population.namespaces[0]
    for kwargs in (
        {"label_selector": "app=("},
        {"field_selector": "spec.foo=x"},
        {"resource_version": "not-a-number"},
        {"resource_version": "0", "resource_version_match": "Exact"},
        {"_continue": "garbage", "limit": 2},
    ):
        errors = []
        for api in (direct, proxied):
            with pytest.raises(ApiException) as err:
                api.list_namespaced_pod(a, **kwargs)
            errors.append((err.value.status, err.value.reason, err.value.body))
        assert errors[1] == errors[0], kwargs


def test_python_client_rv0_served_from_the_cache(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], cache_proxy: RunningProxy, population: Population, wc_sides: Sides
) -> None:
    _, proxied = apis
    before = _served(cache_proxy, "configmaps")
    proxied.list_config_map_for_all_namespaces(resource_version="0")
    proxied.list_namespaced_config_map(population.namespaces[1], resource_version="0", label_selector="team=red")
    assert _served(cache_proxy, "configmaps") - before == 2
