"""A continue token the watch cache served stops working when the apiserver's would: once etcd has
compacted its revision, the cache answers the apiserver's ``410 Expired`` with its "inconsistent
continue" token, and that token resumes the list with exactly the remaining items.

The steps of the upstream conformance spec "[sig-api-machinery] Servers with support for API
chunking should support continue listing from the last key if the original version has been
compacted away, though the list is inconsistent" (``test/e2e/apimachinery/chunking.go``), run with
the official Python client through a ``kproxy run`` caching podtemplates and, in the same test,
directly against the apiserver: same codes, same items, same counts, and the cache's tokens are
tokens the apiserver accepts.

The control plane is the test's own: its apiserver compacts etcd itself every second
(``--etcd-compaction-interval``, 5 min by default), which is what makes its own continue tokens
expire (its cacher learns of a compaction from its own compactor, within 15 s; an etcd compacted
from outside would go unnoticed by it for up to two compaction intervals).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

TOTAL = 400  # numberOfTotalResources
ONE_TENTH = TOTAL // 10
COMPACTION_INTERVAL = "1s"


@pytest.fixture(scope="module")
def own_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A control plane of this test's own (its etcd is compacted): never the shared one."""
    directory = tmp_path_factory.mktemp("cp-compaction")
    cp = envtest.up(directory, apiserver_args=[f"--etcd-compaction-interval={COMPACTION_INTERVAL}"])
    try:
        yield cp
    finally:
        envtest.down(directory)


@pytest.fixture
def cached(own_cp: ControlPlaneInfo, tmp_path: Path) -> Iterator[RunningProxy]:
    chain = {"filters": [{"name": "watchcache", "resources": ["podtemplates"]}]}
    rp = start_proxy(tmp_path / "kproxy", own_cp.admin_kubeconfig, extra=chain)
    try:
        yield rp
    finally:
        rp.stop()


def _create_templates(cp: ControlPlaneInfo, namespace: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    assert cp.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())[0] == 201
    base = f"/api/v1/namespaces/{namespace}/podtemplates"

    def create(i: int) -> int:
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"template-{i:04d}"},
            "template": {"spec": {"containers": [{"name": "test", "image": "test2"}]}},
        }
        return cp.request("POST", base, body=json.dumps(template).encode())[0]

    with ThreadPoolExecutor(20) as pool:  # workqueue.ParallelizeUntil(ctx, 20, ...)
        assert set(pool.map(create, range(TOTAL))) == {201}


def _reads(rp: RunningProxy) -> dict[tuple[str, str], float]:
    """kproxy's podtemplates list reads: (served, reason) -> count."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(rp.metrics()):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "kproxy_watchcache_reads_total" and (labels.get("resource"), labels.get("verb")) == (
                "podtemplates",
                "list",
            ):
                out[(labels["served"], labels["reason"])] = sample.value
    return out


def _fetch(url: str, accept: str, context: ssl.SSLContext | None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class Side:
    """One way to the apiserver: the official Python client, plus raw GETs for byte comparison."""

    def __init__(self, kubeconfig: Path, namespace: str, base: str, context: ssl.SSLContext | None) -> None:
        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.namespace = namespace
        self._base, self._context = base, context

    def list(self, token: str = "", limit: int = ONE_TENTH) -> Any:
        return self.api.list_namespaced_pod_template(self.namespace, limit=limit, _continue=token or None)

    def attempt(self, token: str) -> tuple[int, Any]:
        """A continue: (200, the list) or (its error code, its Status as a dict)."""
        try:
            return 200, self.list(token)
        except ApiException as err:
            return err.status, json.loads(err.body)

    def raw(self, token: str, accept: str) -> tuple[int, bytes]:
        path = f"/api/v1/namespaces/{self.namespace}/podtemplates?limit={ONE_TENTH}&continue={token}"
        return _fetch(self._base + path, accept, self._context)


def _names(items: Any) -> list[str]:
    return [i.metadata.name for i in items]


def _expected(start: int, count: int) -> list[str]:
    return [f"template-{i:04d}" for i in range(start, min(start + count, TOTAL))]


def test_continue_after_compaction_is_the_apiservers_410_and_resumes_inconsistently(
    own_cp: ControlPlaneInfo, cached: RunningProxy
) -> None:
    cp, rp = own_cp, cached
    namespace = "chunking-compacted"
    _create_templates(cp, namespace)
    via = Side(rp.kubeconfig, namespace, rp.url, None)
    direct = Side(cp.admin_kubeconfig, namespace, f"https://127.0.0.1:{cp.apiserver_port}", cp.ssl_context())
    eventually(
        lambda: len(via.api.list_namespaced_pod_template(namespace, resource_version="0").items) == TOTAL,
        30,
        "the cache to hold every template",
    )

    # "retrieving the first page"
    firsts = {}
    for name, side in (("via", via), ("direct", direct)):
        page = side.list()
        assert _names(page.items) == _expected(0, ONE_TENTH), name
        assert page.metadata.remaining_item_count + len(page.items) == TOTAL, name
        assert page.metadata._continue, name
        firsts[name] = page
    first_token, first_rv = firsts["via"].metadata._continue, firsts["via"].metadata.resource_version
    assert _reads(rp).get(("cache", "consistent")) == 1.0  # the cache served its first page

    # A token whose revision is not compacted keeps working, from the cache: the second page.
    status, second = via.attempt(first_token)
    assert status == 200 and _names(second.items) == _expected(ONE_TENTH, ONE_TENTH)
    assert second.metadata.resource_version == first_rv
    assert _reads(rp).get(("cache", "continue")) == 1.0
    # ... and the apiserver accepts the cache's token for the same page.
    status, second_direct = direct.attempt(first_token)
    assert status == 200 and _names(second_direct.items) == _names(second.items)

    # The revision moves on (the apiserver compacts at the revision of its previous round).
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-the-first-page"}}
    assert cp.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(cm).encode())[0] == 201

    # "retrieving the second page until the token expires", on both sides.
    answers: dict[str, tuple[int, Any]] = {}

    def expired(name: str, side: Side, token: str) -> bool:
        status, got = side.attempt(token)
        assert status in (200, 410), (name, status, got)
        answers[name] = (status, got)
        return status == 410

    direct_token = firsts["direct"].metadata._continue
    tokens = {"via": (via, first_token), "direct": (direct, direct_token)}

    def both_expired() -> bool:
        # Each side until it says 410 (the two first pages may be at neighbouring revisions).
        return all([answers.get(name, (0,))[0] == 410 or expired(name, *tokens[name]) for name in tokens])

    try:
        eventually(both_expired, 50, "both tokens to expire", interval=0.5)
    except AssertionError as err:
        pytest.fail(f"{err}; the last answers: { {name: got[0] for name, got in answers.items()} }")
    assert {name: got[0] for name, got in answers.items()} == {"via": 410, "direct": 410}
    # The same Status, byte for byte (both tokens started after template-0039), in each media type.
    for accept in ("application/json", "application/yaml", "application/vnd.kubernetes.protobuf"):
        raw_via, raw_direct = via.raw(first_token, accept), direct.raw(direct_token, accept)
        assert raw_via[0] == raw_direct[0] == 410, accept
        assert raw_via[1] == raw_direct[1], (accept, raw_via, raw_direct)
    status_doc = json.loads(via.raw(first_token, "application/json")[1])
    assert (status_doc["reason"], status_doc["code"]) == ("Expired", 410)
    inconsistent = status_doc["metadata"]["continue"]
    assert inconsistent and answers["via"][1]["metadata"]["continue"] == inconsistent
    assert _reads(rp).get(("cache", "status 410"), 0) >= 1

    # "retrieving the second page again with the token received with the error message"
    pages = {}
    for name, side in (("via", via), ("direct", direct)):
        page = side.list(inconsistent)
        assert page.metadata.resource_version != first_rv, name
        assert _names(page.items) == _expected(ONE_TENTH, ONE_TENTH), name
        assert page.metadata.remaining_item_count + len(page.items) + ONE_TENTH == TOTAL, name
        pages[name] = page
    assert _reads(rp).get(("cache", "consistent")) == 2.0  # the inconsistent continue, from the cache

    # "retrieving all remaining pages", through the cache; each of its tokens is one the apiserver
    # continues the same way.
    found = 2 * ONE_TENTH
    page = pages["via"]
    last_rv = page.metadata.resource_version
    while page.metadata._continue:
        token = page.metadata._continue
        page = via.list(token)
        assert page.metadata.resource_version == last_rv
        assert _names(page.items) == _expected(found, ONE_TENTH)
        if page.metadata._continue:
            assert page.metadata.remaining_item_count + len(page.items) + found == TOTAL
        else:
            assert page.metadata.remaining_item_count is None
        status, same = direct.attempt(token)
        assert status == 200 and _names(same.items) == _names(page.items)
        assert same.metadata.resource_version == last_rv
        found += len(page.items)
    assert found == TOTAL
    reads = _reads(rp)
    assert not {k: v for k, v in reads.items() if k[0] == "upstream"}, reads  # every list from the cache
