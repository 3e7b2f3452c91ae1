"""Wire details of the transcode filter that the corpus tests do not reach, each compared with the
apiserver's own answer: a JSON list long enough for the apiserver to stream its protobuf (kproxy
then transcodes it item by item) ends exactly as the apiserver's JSON does, and protobuf request
bodies for custom resources get what the apiserver answers (its 415, or the 403/404/406 that comes
before it; a CR's ``scale`` takes protobuf).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Iterator

import aiohttp
import pytest
from corpus.compare import JSON, PROTOBUF, YAML, Answer, Sides

from kproxy.codec import ProtobufCodec
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually

CONFIGMAPS = 40  # ~1.3 KB each: a ~50 KB protobuf list, which the apiserver sends chunked


@pytest.fixture(scope="module")
def edges(control_plane: ControlPlaneInfo) -> Iterator[tuple[str, str]]:
    """A namespace with CONFIGMAPS ConfigMaps, and a CRD (with a scale subresource) holding one
    custom resource. Yields (namespace, CR group)."""
    ns = f"tc-edges-{secrets.token_hex(3)}"
    group = f"{ns}.kproxy.test"
    cp = control_plane
    body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).encode()
    assert cp.request("POST", "/api/v1/namespaces", body=body)[0] == 201
    for i in range(CONFIGMAPS):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:03d}"}, "data": {"k": "v" * 1000}}
        assert cp.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=json.dumps(cm).encode())[0] == 201
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"scalers.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "scalers", "singular": "scaler", "kind": "Scaler"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
                    },
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert cp.request("POST", crds, body=json.dumps(crd).encode())[0] == 201
    scaler = {"apiVersion": f"{group}/v1", "kind": "Scaler", "metadata": {"name": "s1"}, "spec": {"replicas": 1}}

    def created() -> bool:
        path = f"/apis/{group}/v1/namespaces/{ns}/scalers"
        return cp.request("POST", path, body=json.dumps(scaler).encode())[0] == 201

    eventually(created, 30, "the Scaler custom resource to be created")
    yield ns, group
    cp.request("DELETE", f"{crds}/scalers.{group}")
    # The namespace never finishes deleting here (no namespace controller): its ConfigMaps (odd
    # strings among them) would stay in later tests' all-namespace lists.
    cp.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps")
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")


async def _pinned(sides: Sides, path: str) -> str:
    """A LIST path pinned to the current resourceVersion: both sides see the same snapshot (and
    list resourceVersion), whatever else writes to the cluster meanwhile."""
    first = await sides.request("GET", path, via_proxy=False)
    assert first.status == 200, first.body[:300]
    rv = first.json()["metadata"]["resourceVersion"]
    return f"{path}{'&' if '?' in path else '?'}resourceVersion={rv}&resourceVersionMatch=Exact"


@pytest.mark.parametrize("accept", [JSON, None, "application/json;stream=watch", f"{PROTOBUF};q=0.5, {JSON}"])
async def test_streamed_list_ends_as_the_apiservers(accept: str | None, edges: tuple[str, str], sides: Sides) -> None:
    """The apiserver's JSON list is json.Encoder.Encode's output: the document and a newline. The
    list kproxy transcodes item by item as the upstream streams it must end the same way."""
    ns, _ = edges
    path = await _pinned(sides, f"/api/v1/namespaces/{ns}/configmaps")
    direct, via = await sides.both("GET", path, accept=accept)
    assert direct.status == via.status == 200
    assert direct.headers.get("Transfer-Encoding") == "chunked"  # the apiserver streams it
    assert len(via.json()["items"]) == CONFIGMAPS
    assert via.content_type == direct.content_type
    assert via.body == direct.body


def _comparable(a: Answer) -> tuple[int, str, str | None, bytes]:
    return a.status, a.content_type, a.headers.get("Cache-Control"), a.body


@pytest.mark.parametrize("accept", [None, JSON, YAML, "application/json;pretty=1", PROTOBUF, "text/html"])
@pytest.mark.parametrize("target", ["create", "update", "status", "unknown-resource"])
@pytest.mark.parametrize("content_type", [PROTOBUF, f"{PROTOBUF};stream=watch", PROTOBUF.upper()])
async def test_protobuf_body_for_a_custom_resource_gets_the_apiservers_refusal(
    accept: str | None, target: str, content_type: str, edges: tuple[str, str], sides: Sides
) -> None:
    """A protobuf body for a custom resource makes kube-apiserver v1.37 drop the connection;
    through kproxy the client gets the answer the apiserver gives to a body type it does not know
    (here ``text/plain``): its 415 in the client's own media type, or the 404/406 it checks first."""
    ns, group = edges
    base = f"/apis/{group}/v1/namespaces/{ns}"
    method, path = {
        "create": ("POST", f"{base}/scalers?dryRun=All"),
        "update": ("PUT", f"{base}/scalers/s1?dryRun=All"),
        "status": ("PUT", f"{base}/scalers/s1/status?dryRun=All"),
        "unknown-resource": ("POST", f"{base}/nothings?dryRun=All"),
    }[target]
    body = ProtobufCodec().from_json(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s1"}, "data": {"k": "v"}}
    )
    pb, plain = {"Content-Type": content_type}, {"Content-Type": "text/plain"}
    if target == "create" and accept is None:
        with pytest.raises(aiohttp.ServerDisconnectedError):  # the apiserver's own reaction
            await sides.request(method, path, via_proxy=False, accept=None, headers=pb, data=body)
    direct = await sides.request(method, path, via_proxy=False, accept=accept, headers=plain, data=body)
    via = await sides.request(method, path, via_proxy=True, accept=accept, headers=pb, data=body)
    assert direct.status in (404, 406, 415)
    assert _comparable(via) == _comparable(direct)


async def test_protobuf_scale_of_a_custom_resource_goes_through(edges: tuple[str, str], sides: Sides) -> None:
    """A CR's ``scale`` subresource is an autoscaling/v1 Scale, which the apiserver decodes from
    protobuf: kproxy passes such a body on instead of refusing it."""
    ns, group = edges
    path = f"/apis/{group}/v1/namespaces/{ns}/scalers/s1/scale"
    scale = (await sides.request("GET", path, via_proxy=False)).json()
    scale["spec"]["replicas"] = 3
    body = ProtobufCodec().from_json(scale)
    hdrs = {"Content-Type": PROTOBUF}
    direct, via = await sides.both("PUT", path + "?dryRun=All", headers=hdrs, data=body)
    assert direct.status == 200 and direct.json()["spec"]["replicas"] == 3
    assert _comparable(via) == _comparable(direct)


# Strings whose YAML form go-yaml (sigs.k8s.io/yaml, the apiserver's writer) and libyaml disagree
# on, or that kproxy once wrote differently: YAML indicators alone, go-yaml's number and
# timestamp resolution, a leading BOM (go-yaml escapes every character after it), NEL (a line
# break to go-yaml's reader, folded), line separators in block scalars, kept trailing newlines.
TRICKY = [
    *("*", "!", "&", "|", ">", "%", "@", "`", "?", "-", ":", "#", "=", "<<", "~", "'", '"', "* a", "a*"),
    *("0x_", "+_1", "1_000", "0o17", "0b101", "-0b1", "0b2", "08", "0777", "1e3", "1e400", ".5", ".5_0", "+."),
    *("1:20", "190:20:30.15", "1:60", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-2-30", "2001-12-14T21:59:43"),
    *("yes", "No", "tRUE", "oN", ".NaN", ".Nan", "0x" + "F" * 20, "9" * 30, ""),
    *("\ufeff", "\ufeffline one\nline two with spaces\n", "\ufeff" + "word " * 30, "a\ufeffb"),
    *("a\x85b", "\x85", "a \x85\x85 b", "x\n\u2028'y", "x\u2028'", "x\n\n", "\n", "x\n\n\u2028"),
    *("x" * 100 + " " + "y" * 100, "a\tb", "\x1b", "\u00a0x", "\U0001f600 a", "a\u2029b\nc"),
]


def _configmap(name: str, data: dict[str, str]) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}).encode()


@pytest.mark.parametrize("shape", ["object", "list"])
async def test_yaml_strings_are_written_as_the_apiserver_writes_them(
    shape: str, edges: tuple[str, str], sides: Sides
) -> None:
    ns, _ = edges
    name = "yaml-strings"
    data = {f"k{i:03d}": v for i, v in enumerate(TRICKY)}
    code, _ = await asyncio.to_thread(
        sides.cp.request, "POST", f"/api/v1/namespaces/{ns}/configmaps", body=_configmap(name, data)
    )
    assert code in (201, 409)
    path = f"/api/v1/namespaces/{ns}/configmaps"
    if shape == "object":
        path = f"{path}/{name}"
    else:
        path = await _pinned(sides, f"{path}?fieldSelector=metadata.name%3D{name}")
    direct, via = await sides.both("GET", path, accept=YAML)
    assert direct.status == 200 and direct.content_type == YAML
    assert (via.status, via.content_type) == (direct.status, direct.content_type)
    assert via.body == direct.body


@pytest.mark.parametrize("char", ["\x7f", "\x80", "\x9f", "\ufffe"])
async def test_yaml_the_apiserver_cannot_write_is_its_500(char: str, edges: tuple[str, str], sides: Sides) -> None:
    """go-yaml's reader refuses DEL, C1 controls other than NEL, U+FFFE/U+FFFF, which Go's JSON
    writes raw: the apiserver answers a YAML request for such an object with a 500 Status."""
    ns, _ = edges
    name = f"yaml-unreadable-{ord(char):x}"
    code, _ = await asyncio.to_thread(
        sides.cp.request, "POST", f"/api/v1/namespaces/{ns}/configmaps", body=_configmap(name, {"k": f"a{char}b"})
    )
    assert code in (201, 409)
    try:
        for path in (
            f"/api/v1/namespaces/{ns}/configmaps/{name}",
            await _pinned(sides, f"/api/v1/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3D{name}"),
        ):
            direct, via = await sides.both("GET", path, accept=YAML)
            assert direct.status == 500 and b"control characters are not allowed" in direct.body
            assert (via.status, via.content_type, via.body) == (direct.status, direct.content_type, direct.body)
            json_direct, json_via = await sides.both("GET", path)
            assert json_direct.status == json_via.status == 200 and json_via.body == json_direct.body
    finally:
        # Namespaces never finish deleting here (no namespace controller): an object no YAML
        # reader takes must not outlive the test, or later tests' `kubectl get -A -o yaml` break.
        await asyncio.to_thread(sides.cp.request, "DELETE", f"/api/v1/namespaces/{ns}/configmaps/{name}")


async def test_yaml_of_rbac_style_wildcards(sides: Sides) -> None:
    """FlowSchemas (and RBAC rules) are full of "*": go-yaml writes '*', never ``! '*'``."""
    path = await _pinned(sides, "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas")
    direct, via = await sides.both("GET", path, accept=YAML)
    assert direct.status == 200 and b"- '*'" in direct.body
    assert (via.status, via.body) == (direct.status, direct.body)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"a\x85b": ["v"]}, id="nel-in-key"),
        pytest.param({"k": ["x" * 600 + "\x7f"], "z\x85": ["v"]}, id="nel-key-before-del-chunk"),
        pytest.param({"k": ["x\x7f"], "z\x85": ["v"]}, id="del-in-first-chunk"),
        pytest.param({"k": ["a\x85b", "\x85", "a\u2028'"]}, id="nel-in-values"),
        pytest.param({"\ufeffk": ["\ufeffv w"], "\ufeff": ["\ufeff" + "word " * 30]}, id="bom"),
    ],
)
async def test_yaml_map_keys_as_the_apiserver_reads_them(extra: dict[str, list[str]], sides: Sides) -> None:
    """A SubjectAccessReview echoes ``spec.extra``, a map whose keys nothing validates. A raw
    NEL (Go's JSON does not escape it) is a line break to go-yaml, which a flow mapping's key may
    not span: the apiserver answers YAML with a 500 naming the line, unless its reader met a
    character it refuses first (it decodes 512-byte chunks ahead)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "extra": extra, "resourceAttributes": {"verb": "get", "resource": "pods"}},
    }
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    hdrs = {"Content-Type": JSON}
    direct, via = await sides.both("POST", path, accept=YAML, headers=hdrs, data=json.dumps(review).encode())
    assert direct.status in (201, 500)
    # The two reviews' managedFields may be stamped in different seconds.
    untimed = [re.sub(rb'(?m)^(\s*)time: "[^"]*"$', rb"\1time: T", a.body) for a in (direct, via)]
    assert (via.status, via.content_type, untimed[1]) == (direct.status, direct.content_type, untimed[0])
