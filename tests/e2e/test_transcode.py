"""The transcode filter with real clients: kubectl and the official Python client through kproxy
with ``transcode: {upstream: protobuf}`` behave exactly as directly, and raw HTTP requests get the
apiserver's own negotiation (media types, pretty printing, 406s, Tables, custom resources).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import corpus
import pytest
import yaml
from corpus.compare import JSON, PROTOBUF, YAML, Sides
from kubernetes import client, watch

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


@pytest.fixture(scope="module")
def loaded(control_plane: ControlPlaneInfo) -> Iterator[tuple[str, list[corpus.CorpusObject]]]:
    """The corpus in its own namespace, plus one custom resource of its CRD."""
    ns = f"transcode-{secrets.token_hex(3)}"
    body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).encode()
    assert control_plane.request("POST", "/api/v1/namespaces", body=body)[0] == 201
    objects = corpus.load(control_plane, ns)
    crd = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.corpus-{ns}.kproxy.test"

    def established() -> bool:
        _, raw = control_plane.request("GET", crd)
        conds = json.loads(raw).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    eventually(established, 30, "the corpus CRD to be established")
    widget = {
        "apiVersion": f"corpus-{ns}.kproxy.test/v1",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": "large", "port": "http", "tags": ["a", "b"], "raw": {"any": [1, {"x": None}]}},
    }

    def create_widget() -> bool:
        code, _ = control_plane.request(
            "POST", f"/apis/corpus-{ns}.kproxy.test/v1/namespaces/{ns}/widgets", body=json.dumps(widget).encode()
        )
        return code == 201

    eventually(create_widget, 30, "the Widget custom resource to be created")
    yield ns, objects
    corpus.cleanup(control_plane, objects)
    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


def _counter(rp: RunningProxy, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}}" if labels else name
    for line in rp.metrics().splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[-1])
    return 0.0


# ----------------------------------------------------------------------------- kubectl


_AGE = re.compile(r"(?:^|(?<=\s))\d+[smhdy](\d+[smh])?(?=\s|$)", re.M)  # an events table begins with one


def _cells(table: str) -> list[list[str]]:
    """A printed table's cells, ages masked (column widths follow the longest cell)."""
    return [_AGE.sub("<age>", line).split() for line in table.splitlines()]


RESOURCES = [
    "configmaps",
    "secrets",
    "services",
    "pods",
    "deployments.apps",
    "statefulsets.apps",
    "cronjobs.batch",
    "horizontalpodautoscalers.autoscaling",
    "leases.coordination.k8s.io",
    "events.events.k8s.io",
    "endpointslices.discovery.k8s.io",
    "networkpolicies.networking.k8s.io",
    "roles.rbac.authorization.k8s.io",
    "resourcequotas",
    "limitranges",
]


@pytest.mark.parametrize("output", ["json", "yaml", "table", "wide"])
def test_kubectl_get_matches_direct(
    output: str, loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, kubectl: Kubectl
) -> None:
    ns, _ = loaded
    before = _counter(pb_proxy, "kproxy_transcode_responses_total", 'shape="list"')
    args = ["get", ",".join(RESOURCES), "-n", ns]
    if output in ("json", "yaml", "wide"):
        args += ["-o", output]
    direct = kubectl(args)
    via = kubectl(args, kubeconfig=pb_proxy.kubeconfig)
    if output in ("table", "wide"):
        # The AGE column is the server's "now" minus creation: the two runs may straddle a second,
        # and an age one character longer (9s, 10s) widens the column: cells are compared.
        assert _cells(via.stdout) == _cells(direct.stdout)
    else:
        assert via.stdout == direct.stdout
    assert via.stderr == direct.stderr
    after = _counter(pb_proxy, "kproxy_transcode_responses_total", 'shape="list"')
    if output in ("json", "yaml"):
        assert after - before >= len(RESOURCES)  # kubectl asked JSON: kproxy transcoded every list
    else:
        assert after == before  # Tables (as=Table) pass through untouched


def test_kubectl_get_single_objects_and_cluster_scoped(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, kubectl: Kubectl
) -> None:
    ns, objects = loaded
    for obj in objects:
        kind = f"{obj.resource}.{obj.group}" if obj.group else obj.resource
        args = ["get", kind, obj.name, "-o", "json"] + (["-n", ns] if obj.namespace else [])
        assert kubectl(args, kubeconfig=pb_proxy.kubeconfig).stdout == kubectl(args).stdout, obj


def test_kubectl_writes_through_protobuf_upstream(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, kubectl: Kubectl
) -> None:
    ns, _ = loaded
    manifest = json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "written", "namespace": ns}, "data": {"a": "1"}}
    )
    kc = pb_proxy.kubeconfig
    assert kubectl(["apply", "-f", "-"], kubeconfig=kc, input=manifest).stdout == "configmap/written created\n"
    assert (
        kubectl(["apply", "--server-side", "-f", "-"], kubeconfig=kc, input=manifest).stdout
        == "configmap/written serverside-applied\n"
    )
    out = kubectl(["patch", "cm", "written", "-n", ns, "-p", '{"data":{"b":"2"}}', "-o", "json"], kubeconfig=kc)
    assert json.loads(out.stdout)["data"] == {"a": "1", "b": "2"}
    assert kubectl(["get", "cm", "written", "-n", ns, "-o", "json"]).stdout == out.stdout
    res = kubectl(["create", "cm", "written", "-n", ns], kubeconfig=kc, check=False)
    direct = kubectl(["create", "cm", "written", "-n", ns], check=False)
    assert (res.returncode, res.stderr) == (direct.returncode, direct.stderr)  # AlreadyExists, via protobuf Status
    assert kubectl(["delete", "cm", "written", "-n", ns], kubeconfig=kc).stdout.startswith(
        'configmap "written" deleted'
    )
    res = kubectl(["get", "cm", "written", "-n", ns], kubeconfig=kc, check=False)
    assert res.stderr == 'Error from server (NotFound): configmaps "written" not found\n'


def test_kubectl_custom_resource_falls_back_to_json(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, kubectl: Kubectl
) -> None:
    ns, _ = loaded
    before = _counter(pb_proxy, "kproxy_transcode_passthrough_total")
    widgets = f"widgets.corpus-{ns}.kproxy.test"
    for args in (["get", widgets, "-n", ns, "-o", "json"], ["get", widgets, "w1", "-n", ns, "-o", "yaml"]):
        assert kubectl(args, kubeconfig=pb_proxy.kubeconfig).stdout == kubectl(args).stdout
    assert _counter(pb_proxy, "kproxy_transcode_passthrough_total") - before >= 2


# ----------------------------------------------------------------------------- Python client


def _api(url: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    return client.ApiClient(cfg)


def test_python_client_reads_match_direct(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, control_plane: ControlPlaneInfo
) -> None:
    ns, _ = loaded
    direct_cfg = client.Configuration()
    direct_cfg.host = control_plane.server
    direct_cfg.ssl_ca_cert = str(control_plane.ca_file)
    direct_cfg.cert_file = str(control_plane.admin_cert)
    direct_cfg.key_file = str(control_plane.admin_key)
    with _api(pb_proxy.url) as via_api, client.ApiClient(direct_cfg) as direct_api:
        pairs: list[tuple[Any, Any]] = [
            (client.CoreV1Api(via_api).read_namespaced_pod, client.CoreV1Api(direct_api).read_namespaced_pod),
            (client.CoreV1Api(via_api).read_namespaced_secret, client.CoreV1Api(direct_api).read_namespaced_secret),
        ]
        for (via_read, direct_read), name in zip(pairs, ["corpus-pod", "corpus-secret"], strict=True):
            got = via_api.sanitize_for_serialization(via_read(name, ns))
            want = direct_api.sanitize_for_serialization(direct_read(name, ns))
            assert got == want
        lists = [
            (client.CoreV1Api(via_api).list_namespaced_pod, client.CoreV1Api(direct_api).list_namespaced_pod),
            (
                client.AppsV1Api(via_api).list_namespaced_deployment,
                client.AppsV1Api(direct_api).list_namespaced_deployment,
            ),
            (
                client.BatchV1Api(via_api).list_namespaced_cron_job,
                client.BatchV1Api(direct_api).list_namespaced_cron_job,
            ),
            (
                client.AutoscalingV2Api(via_api).list_namespaced_horizontal_pod_autoscaler,
                client.AutoscalingV2Api(direct_api).list_namespaced_horizontal_pod_autoscaler,
            ),
        ]
        for via_list, direct_list in lists:
            want = direct_api.sanitize_for_serialization(direct_list(ns))
            rv = want["metadata"]["resourceVersion"]
            got = via_api.sanitize_for_serialization(via_list(ns, resource_version=rv, resource_version_match="Exact"))
            want = direct_api.sanitize_for_serialization(
                direct_list(ns, resource_version=rv, resource_version_match="Exact")
            )
            assert got == want
        with pytest.raises(client.ApiException) as via_err:
            client.CoreV1Api(via_api).read_namespaced_config_map("missing", ns)
        with pytest.raises(client.ApiException) as direct_err:
            client.CoreV1Api(direct_api).read_namespaced_config_map("missing", ns)
        assert (via_err.value.status, via_err.value.body) == (direct_err.value.status, direct_err.value.body)


def test_python_client_watch_events_arrive_transcoded(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, kubectl: Kubectl
) -> None:
    ns, _ = loaded
    seen: list[tuple[str, str, dict[str, Any]]] = []
    w = watch.Watch()

    with _api(pb_proxy.url) as api:
        core = client.CoreV1Api(api)

        def run() -> None:
            for ev in w.stream(core.list_namespaced_config_map, ns, timeout_seconds=60, label_selector="watched=yes"):
                seen.append((ev["type"], ev["object"].metadata.name, ev["raw_object"]))
                if ev["type"] == "DELETED":
                    w.stop()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        kubectl(["create", "cm", "live", "-n", ns, "--from-literal=a=1"])
        kubectl(["label", "cm", "live", "-n", ns, "watched=yes"])
        eventually(lambda: any(s[0] == "ADDED" for s in seen), 20, "the ADDED event through kproxy")
        kubectl(["patch", "cm", "live", "-n", ns, "-p", '{"data":{"a":"2"}}'])
        eventually(lambda: any(s[0] == "MODIFIED" for s in seen), 20, "the MODIFIED event through kproxy")
        kubectl(["delete", "cm", "live", "-n", ns])
        t.join(20)
    assert [s[0] for s in seen] == ["ADDED", "MODIFIED", "DELETED"]
    assert seen[1][2]["data"] == {"a": "2"}
    assert seen[1][2]["metadata"]["labels"] == {"watched": "yes"}


# ----------------------------------------------------------------------------- raw negotiation


ACCEPTS = [
    None,
    "*/*",
    JSON,
    YAML,
    "application/json;q=0.5, application/yaml",
    "text/html, application/yaml;q=0.1",
    "application/json;pretty=1",
    "text/html",  # 406 from the handler
    "application/*",  # 406 from go-restful's route check
    PROTOBUF,
    f"{PROTOBUF}, {JSON}",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/yaml;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
]


async def pinned(sides: Sides, path: str) -> str:
    """A LIST path pinned to the current resourceVersion (``Exact``), so that two requests see
    the same snapshot (and the same ``metadata.resourceVersion``) whatever changes meanwhile."""
    first = await sides.request("GET", path, via_proxy=False, accept=JSON)
    assert first.status == 200, first.body[:300]
    rv = first.json()["metadata"]["resourceVersion"]
    sep = "&" if "?" in path else "?"
    return f"{path}{sep}resourceVersion={rv}&resourceVersionMatch=Exact"


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("target", ["object", "list", "missing"])
async def test_negotiation_matches_the_apiserver(
    accept: str | None, target: str, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides
) -> None:
    ns, _ = loaded
    path = {
        "object": f"/api/v1/namespaces/{ns}/pods/corpus-pod",
        "list": f"/apis/apps/v1/namespaces/{ns}/deployments",
        "missing": f"/api/v1/namespaces/{ns}/configmaps/none",
    }[target]
    if target == "list":
        path = await pinned(sides, path)
    direct, via = await sides.both("GET", path, accept=accept)
    assert (via.status, via.content_type) == (direct.status, direct.content_type)
    if "Table" in (accept or "") and direct.status == 200:
        # Tables carry the time of the request in their rows' age: compare their shape only.
        assert yaml.safe_load(via.body)["kind"] == yaml.safe_load(direct.body)["kind"] == "Table"
        return
    if direct.content_type == JSON:
        assert via.json() == direct.json()
    if direct.content_type == YAML:
        assert yaml.safe_load(via.body) == yaml.safe_load(direct.body)
    assert via.body == direct.body


@pytest.mark.parametrize("pretty", ["?pretty=true", "?pretty=1", "?pretty=false", ""])
@pytest.mark.parametrize("agent", ["curl/8.5.0", "kubectl/v1.37.1", "Mozilla/5.0 (X11)"])
async def test_pretty_printing_matches(
    pretty: str, agent: str, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides
) -> None:
    ns, _ = loaded
    services = await pinned(sides, f"/api/v1/namespaces/{ns}/services")
    for path in (f"/api/v1/namespaces/{ns}/configmaps/corpus-cm-immutable?", services + "&"):
        direct, via = await sides.both("GET", path + pretty.lstrip("?"), headers={"User-Agent": agent})
        assert via.status == direct.status == 200
        assert via.body == direct.body


async def test_watch_in_yaml_is_the_apiservers_406(loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    ns, _ = loaded
    direct, via = await sides.both("GET", f"/api/v1/namespaces/{ns}/configmaps?watch=1", accept=YAML)
    assert direct.status == 406
    assert (via.status, via.content_type, via.body) == (direct.status, direct.content_type, direct.body)


@pytest.mark.parametrize("accept", [JSON, YAML, PROTOBUF, f"{PROTOBUF}, {JSON}", "text/html", "application/*", None])
@pytest.mark.parametrize("target", ["object", "list", "missing"])
async def test_custom_resource_gets_what_the_apiserver_answers(
    accept: str | None, target: str, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides
) -> None:
    ns, _ = loaded
    base = f"/apis/corpus-{ns}.kproxy.test/v1/namespaces/{ns}/widgets"
    path = {"object": f"{base}/w1", "list": await pinned(sides, base), "missing": f"{base}/none"}[target]
    direct, via = await sides.both("GET", path, accept=accept)
    assert (via.status, via.content_type) == (direct.status, direct.content_type)
    assert via.body == direct.body


async def test_watch_event_is_not_held_back(loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    """A watch event reaches the client through kproxy as soon as the apiserver sends it: the
    client sees it before the next change is even made."""
    ns, _ = loaded
    name = f"ping-{secrets.token_hex(2)}"
    path = f"/api/v1/namespaces/{ns}/configmaps?watch=1&fieldSelector=metadata.name%3D{name}&resourceVersion=0"
    async with sides.stream(path, via_proxy=True) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == JSON
        for i in range(3):
            body = json.dumps({"metadata": {"name": name}, "data": {"i": str(i)}}).encode()
            if i == 0:
                code, _ = await asyncio.to_thread(
                    sides.cp.request, "POST", f"/api/v1/namespaces/{ns}/configmaps", body=body
                )
            else:
                code, _ = await asyncio.to_thread(
                    sides.cp.request,
                    "PUT",
                    f"/api/v1/namespaces/{ns}/configmaps/{name}",
                    body=json.dumps({**json.loads(body), "metadata": {"name": name}}).encode(),
                )
            assert code in (200, 201)
            line = await asyncio.wait_for(resp.content.readline(), 10)
            event = json.loads(line)
            assert event["type"] == ("ADDED" if i == 0 else "MODIFIED")
            assert event["object"]["data"] == {"i": str(i)}


@pytest.mark.parametrize("mode", ["auto", "json"])
async def test_auto_and_json_modes(
    mode: str,
    loaded: tuple[str, list[corpus.CorpusObject]],
    control_plane: ControlPlaneInfo,
    proxy_factory: Any,
) -> None:
    """`auto` transcodes the built-in group versions the codec knows and leaves custom resources
    untouched (not even rewritten); `json` turns the filter off."""
    ns, _ = loaded
    rp: RunningProxy = await asyncio.to_thread(
        proxy_factory, extra={"filters": [{"name": "transcode", "upstream": mode}]}
    )
    s = Sides(control_plane, rp.url)
    try:
        for path in (
            f"/api/v1/namespaces/{ns}/pods/corpus-pod",
            f"/apis/batch/v1/namespaces/{ns}/cronjobs/corpus-cronjob",
        ):
            direct, via = await s.both("GET", path)
            assert via.status == 200 and via.json() == direct.json()
        built_in = _counter(rp, "kproxy_transcode_responses_total", 'shape="object"')
        assert built_in == (2 if mode == "auto" else 0)
        direct, via = await s.both("GET", f"/apis/corpus-{ns}.kproxy.test/v1/namespaces/{ns}/widgets/w1")
        assert (via.status, via.body) == (direct.status, direct.body)
        assert _counter(rp, "kproxy_transcode_passthrough_total") == 0  # the request was not even rewritten
        assert _counter(rp, "kproxy_transcode_responses_total", 'shape="object"') == built_in
    finally:
        await s.close()


async def test_request_bodies_go_upstream_as_sent(loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    """No request body is re-encoded: an unknown field in a JSON body meets the apiserver's strict
    field validation exactly as directly (a re-encoding through protobuf would have dropped it), a
    protobuf body is taken by the apiserver itself, and a protobuf body for a custom resource gets
    the apiserver's own refusal."""
    from kproxy.codec import ProtobufCodec

    ns, _ = loaded
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    bad = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "strict"}, "bogus": 1}).encode()
    hdrs = {"Content-Type": JSON}
    direct, via = await sides.both("POST", cms + "?fieldValidation=Strict&dryRun=All", headers=hdrs, data=bad)
    assert direct.status == 400 and "bogus" in direct.json()["message"]
    assert (via.status, via.body) == (direct.status, direct.body)

    codec = ProtobufCodec()
    for i, via_proxy in enumerate((False, True)):
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"pb-{i}"}, "data": {"k": "v"}}
        answer = await sides.request(
            "POST", cms, via_proxy=via_proxy, headers={"Content-Type": PROTOBUF}, data=codec.from_json(obj)
        )
        assert answer.status == 201, answer.body[:300]
        assert answer.json()["data"] == {"k": "v"}

    # A protobuf body for a custom resource: kube-apiserver v1.37 panics on it and drops the
    # connection; through kproxy the client gets the apiserver's own 415 for a type it does not
    # know (tests/e2e/test_transcode_wire_edges.py covers the other answers).
    widgets = f"/apis/corpus-{ns}.kproxy.test/v1/namespaces/{ns}/widgets"
    body = codec.from_json({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w-pb"}})
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await sides.request("POST", widgets, via_proxy=False, headers={"Content-Type": PROTOBUF}, data=body)
    via = await sides.request("POST", widgets, via_proxy=True, headers={"Content-Type": PROTOBUF}, data=body)
    direct = await sides.request("POST", widgets, via_proxy=False, headers={"Content-Type": "text/plain"}, data=body)
    assert (via.status, via.content_type) == (415, JSON)
    assert via.body == direct.body
    assert via.json()["reason"] == "UnsupportedMediaType"


async def test_behind_the_compression_filter(
    loaded: tuple[str, list[corpus.CorpusObject]],
    control_plane: ControlPlaneInfo,
    proxy_factory: Any,
    kubectl: Kubectl,
) -> None:
    """`compression` first, then `transcode`: clients that ask for gzip get the transcoded JSON
    compressed, the others plain; kubectl sees exactly what it sees directly."""
    ns, _ = loaded
    rp: RunningProxy = await asyncio.to_thread(
        proxy_factory, extra={"filters": [{"name": "compression"}, {"name": "transcode", "upstream": "protobuf"}]}
    )
    args = ["get", "pods,deployments.apps,configmaps", "-n", ns, "-o", "json"]
    via = await asyncio.to_thread(kubectl, args, kubeconfig=rp.kubeconfig)
    assert via.stdout == (await asyncio.to_thread(kubectl, args)).stdout
    s = Sides(control_plane, rp.url)
    try:
        path = await pinned(s, f"/api/v1/namespaces/{ns}/pods")
        direct = await s.request("GET", path, via_proxy=False)
        gz = await s.request("GET", path, via_proxy=True, headers={"Accept-Encoding": "gzip"})
        assert (gz.status, gz.headers.get("Content-Encoding"), gz.content_type) == (200, "gzip", JSON)
        assert json.loads(gzip.decompress(gz.body)) == direct.json()
    finally:
        await s.close()
    assert _counter(rp, "kproxy_transcode_responses_total", 'shape="list"') >= 4
