"""kproxy.cacher.fields: parsing and escaping (apimachinery's fields/selector_test.go tables), every
built-in resource's selectable fields as kube-apiserver v1.37.1 accepts them, and the JSON and protobuf
extractors on real objects (they must agree)."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.cacher import fields as F
from kproxy.cacher.fields import (
    SelectableFields,
    SelectorError,
    builtin_fields,
    crd_fields,
    escape_value,
    parse_field_selector,
    unescape_value,
)
from kproxy.codec.codec import ProtobufCodec
from kproxy.codec.envelope import decode_envelope
from kproxy.codec.schema import load_schema


class _AnyField(SelectableFields):
    """Accepts every field name unchanged: the parser's behaviour without a kind's conversion."""

    def __init__(self) -> None:
        super().__init__({}, [], str)

    def convert(self, label: str) -> str:
        return label


ANY = _AnyField()


# fields/selector_test.go TestSplitTerms
@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("a", ["a"]),
        ("a=avalue", ["a=avalue"]),
        ("a=avalue,b=bvalue", ["a=avalue", "b=bvalue"]),
        ("a=avalue,b==bvalue,c!=cvalue", ["a=avalue", "b==bvalue", "c!=cvalue"]),
        ("", []),
        ("a=a,", ["a=a", ""]),
        (",a=a", ["", "a=a"]),
        ("k=\\,,k2=v2", ["k=\\,", "k2=v2"]),
        ("k=\\\\,k2=v2", ["k=\\\\", "k2=v2"]),
        ("k=\\\\\\,,k2=v2", ["k=\\\\\\,", "k2=v2"]),
        ("k=\\a\\b\\", ["k=\\a\\b\\"]),
        ("k=\\", ["k=\\"]),
        ("함=수,목=록", ["함=수", "목=록"]),
        ("a in (x,y)", ["a in (x", "y)"]),  # no parentheses in v1.37's splitTerms
    ],
)
def test_go_split_terms(text: str, terms: list[str]) -> None:
    assert F._split_terms(text) == terms


# fields/selector_test.go TestSplitTerm
@pytest.mark.parametrize(
    ("term", "want"),
    [
        ("a=value", ("a", "=", "value")),
        ("b==value", ("b", "==", "value")),
        ("c!=value", ("c", "!=", "value")),
        ("", None),
        ("a", None),
        ("k=\\,", ("k", "=", "\\,")),
        ("k=\\=", ("k", "=", "\\=")),
        ("k=\\\\\\a\\b\\=\\,\\", ("k", "=", "\\\\\\a\\b\\=\\,\\")),
        ("함=수", ("함", "=", "수")),
        ("a!==b", ("a", "!=", "=b")),  # the first operator found wins
        ("a=!=b", ("a", "=", "!=b")),
    ],
)
def test_go_split_term(term: str, want: tuple[str, str, str] | None) -> None:
    assert F._split_term(term) == want


# fields/selector_test.go TestEscapeValue
@pytest.mark.parametrize(
    ("raw", "escaped"),
    [("", ""), ("a", "a"), ("=", "\\="), (",", "\\,"), ("\\", "\\\\"), ("\\=\\,\\", "\\\\\\=\\\\\\,\\\\")],
)
def test_go_escape_round_trip(raw: str, escaped: str) -> None:
    assert escape_value(raw) == escaped
    assert unescape_value(escaped) == raw


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("\\", "invalid field selector: invalid escape sequence: \\"),
        ("\\\\\\", "invalid field selector: invalid escape sequence: \\"),
        ("\\a", "invalid field selector: invalid escape sequence: \\a"),
        ("a=b", "invalid field selector: unescaped character in value: 61"),
        ("a,b", "invalid field selector: unescaped character in value: 44"),
    ],
)
def test_unescape_errors(value: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        unescape_value(value)
    assert str(info.value) == message


# fields/selector_test.go TestSelectorParse
@pytest.mark.parametrize("text", ["x=a,y=b,z=c", "", "x!=a,y=b", "x=a||y\\=b", "x=a\\=\\=b"])
def test_go_good_strings(text: str) -> None:
    parse_field_selector(text, ANY)


@pytest.mark.parametrize("text", ["x=a||y=b", "x==a==b", "x=a,b", "x in (a)", "x in (a,b,c)", "x"])
def test_go_bad_strings(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_field_selector(text, ANY)


def test_parse_details() -> None:
    sel = parse_field_selector("b!=2,,a==1,c=x\\,y", ANY)
    assert sel.terms == (("a", "1", True), ("b", "2", False), ("c", "x,y", True))  # sorted, empty skipped
    assert sel.fields == frozenset({"a", "b", "c"}) and not sel.empty
    assert parse_field_selector(",,", ANY).empty
    assert parse_field_selector("a = b", ANY).terms == (("a ", " b", True),)  # nothing is trimmed
    with pytest.raises(SelectorError) as info:
        parse_field_selector("x in (a,b)", ANY)
    assert str(info.value) == "invalid selector: 'x in (a,b)'; can't understand 'b)'"


# fields/selector_test.go TestSelectorMatches, plus the missing-field rule
@pytest.mark.parametrize(
    ("text", "fields", "want"),
    [
        ("", {"x": "y"}, True),
        ("x=y", {"x": "y"}, True),
        ("x=y,z=w", {"x": "y", "z": "w"}, True),
        ("x!=y,z!=w", {"x": "z", "z": "a"}, True),
        ("notin=in", {"notin": "in"}, True),
        ("x=y", {"x": "z"}, False),
        ("x=y,z=w", {"x": "w", "z": "w"}, False),
        ("x!=y,z!=w", {"x": "z", "z": "w"}, False),
        ("foo=bar,baz=blah,complex=\\=value\\\\\\,\\\\", {"foo": "bar", "baz": "blah", "complex": "=value\\,\\"}, True),
        ("foo=bar,foobar=bar,baz=blah", {"foo": "bar", "baz": "blah"}, False),
        ("x=", {}, True),  # a field the set lacks reads as ""
        ("x!=", {}, False),
        ("x!=a", {}, True),
    ],
)
def test_go_matches(text: str, fields: dict[str, str], want: bool) -> None:
    assert parse_field_selector(text, ANY).matches(fields) is want


def test_syntax_errors_come_before_unknown_fields() -> None:
    pods = builtin_fields("", "pods")
    with pytest.raises(SelectorError) as info:
        parse_field_selector("bogus=1,metadata.name=a\\q", pods)
    assert "invalid escape sequence" in str(info.value)
    with pytest.raises(SelectorError) as info:
        parse_field_selector("zzz=1,bogus=2", pods)
    assert str(info.value) == "field label not supported: bogus"  # sorted: bogus is checked first


# Every field name each built-in resource accepts, as kube-apiserver v1.37.1 answers (probed with
# fieldSelector=<name>=x on every listable resource; the e2e test re-checks a table of them live).
ACCEPTED = {
    ("", "pods"): {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.host",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    },
    ("", "nodes"): {"metadata.name", "spec.unschedulable"},
    ("", "replicationcontrollers"): {"metadata.name", "metadata.namespace", "status.replicas"},
    ("", "events"): {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    ("events.k8s.io", "events"): {
        "metadata.name",
        "metadata.namespace",
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    },
    ("", "namespaces"): {"metadata.name", "status.phase"},
    ("", "secrets"): {"metadata.name", "metadata.namespace", "type"},
    ("", "services"): {"metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"},
    ("batch", "jobs"): {"metadata.name", "metadata.namespace", "status.successful"},
    ("certificates.k8s.io", "certificatesigningrequests"): {"metadata.name", "spec.signerName"},
    ("certificates.k8s.io", "clustertrustbundles"): {"metadata.name", "spec.signerName"},
    ("certificates.k8s.io", "podcertificaterequests"): {
        "metadata.name",
        "spec.signerName",
        "spec.podName",
        "spec.nodeName",
    },
    ("resource.k8s.io", "resourceslices"): {"metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"},
}
DEFAULT_KINDS = [
    ("", "configmaps"),
    ("", "persistentvolumes"),
    ("", "serviceaccounts"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("batch", "cronjobs"),
    ("rbac.authorization.k8s.io", "roles"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
]
REJECT = {
    ("batch", "jobs"): 'field label "x.y" not supported for Job',
    ("resource.k8s.io", "resourceslices"): "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: x.y",
}


@pytest.mark.parametrize("key", list(ACCEPTED))
def test_builtin_field_sets(key: tuple[str, str]) -> None:
    sf = builtin_fields(*key)
    assert set(sf.accepted) == ACCEPTED[key]
    with pytest.raises(SelectorError) as info:
        sf.convert("x.y")
    assert str(info.value) == REJECT.get(key, "field label not supported: x.y")
    probes = ["metadata.uid", "spec", "status", "metadata.name.x"]
    for probe in probes:
        with pytest.raises(SelectorError):
            sf.convert(probe)


@pytest.mark.parametrize("key", DEFAULT_KINDS)
def test_default_field_set(key: tuple[str, str]) -> None:
    sf = builtin_fields(*key)
    assert set(sf.accepted) == {"metadata.name", "metadata.namespace"}
    with pytest.raises(SelectorError) as info:
        sf.convert("spec.replicas")
    assert (
        str(info.value) == '"spec.replicas" is not a known field selector: only "metadata.name", "metadata.namespace"'
    )


def test_renames() -> None:
    assert builtin_fields("", "pods").convert("spec.host") == "spec.nodeName"
    assert builtin_fields("core", "pods") is builtin_fields("", "pods")
    ev = builtin_fields("events.k8s.io", "events")
    assert ev.convert("regarding.kind") == "involvedObject.kind"
    assert ev.convert("reportingController") == "reportingComponent"
    sel = parse_field_selector("spec.host=n1", builtin_fields("", "pods"))
    assert sel.fields == frozenset({"spec.nodeName"})


# --------------------------------------------------------------------------- extractors on real objects

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {
        "nodeName": "node-a",
        "restartPolicy": "Never",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "robot",
        "hostNetwork": True,
        "containers": [{"name": "c", "image": "i"}],
    },
    "status": {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
        "nominatedNodeName": "node-b",
    },
}
BARE_POD: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "ns"}}

CASES: list[tuple[tuple[str, str], dict[str, Any], dict[str, str]]] = [
    (
        ("", "pods"),
        POD,
        {
            "metadata.name": "p",
            "metadata.namespace": "ns",
            "spec.nodeName": "node-a",
            "spec.restartPolicy": "Never",
            "spec.schedulerName": "default-scheduler",
            "spec.serviceAccountName": "robot",
            "spec.hostNetwork": "true",
            "status.phase": "Running",
            "status.podIP": "10.0.0.1",
            "status.nominatedNodeName": "node-b",
        },
    ),
    (
        ("", "pods"),
        BARE_POD,
        {
            "metadata.name": "q",
            "metadata.namespace": "ns",
            "spec.nodeName": "",
            "spec.restartPolicy": "",
            "spec.schedulerName": "",
            "spec.serviceAccountName": "",
            "spec.hostNetwork": "false",
            "status.phase": "",
            "status.podIP": "",
            "status.nominatedNodeName": "",
        },
    ),
    (
        ("", "pods"),
        {**BARE_POD, "status": {"podIPs": [{"ip": "10.9.9.9"}]}},
        {
            **dict.fromkeys(
                ["spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName"], ""
            ),
            "metadata.name": "q",
            "metadata.namespace": "ns",
            "spec.hostNetwork": "false",
            "status.phase": "",
            "status.podIP": "10.9.9.9",
            "status.nominatedNodeName": "",
        },
    ),
    (
        ("", "nodes"),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": True}},
        {"metadata.name": "n", "metadata.namespace": "", "spec.unschedulable": "true"},
    ),
    (
        ("", "nodes"),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}},
        {"metadata.name": "n", "metadata.namespace": "", "spec.unschedulable": "false"},
    ),
    (
        ("", "replicationcontrollers"),
        {
            "apiVersion": "v1",
            "kind": "ReplicationController",
            "metadata": {"name": "r", "namespace": "ns"},
            "status": {"replicas": 3},
        },
        {"metadata.name": "r", "metadata.namespace": "ns", "status.replicas": "3"},
    ),
    (
        ("", "replicationcontrollers"),
        {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "r", "namespace": "ns"}},
        {"metadata.name": "r", "metadata.namespace": "ns", "status.replicas": "0"},
    ),
    (
        ("", "events"),
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": "ns",
                "name": "p",
                "uid": "u",
                "apiVersion": "v1",
                "resourceVersion": "7",
                "fieldPath": "spec.containers{c}",
            },
            "reason": "Started",
            "source": {"component": "kubelet"},
            "reportingComponent": "rc",
            "type": "Normal",
        },
        {
            "metadata.name": "e",
            "metadata.namespace": "ns",
            "involvedObject.kind": "Pod",
            "involvedObject.namespace": "ns",
            "involvedObject.name": "p",
            "involvedObject.uid": "u",
            "involvedObject.apiVersion": "v1",
            "involvedObject.resourceVersion": "7",
            "involvedObject.fieldPath": "spec.containers{c}",
            "reason": "Started",
            "reportingComponent": "rc",
            "source": "kubelet",
            "type": "Normal",
        },
    ),
    (
        ("", "events"),
        {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ns"}, "reportingComponent": "rc"},
        {
            "metadata.name": "e",
            "metadata.namespace": "ns",
            **{
                f"involvedObject.{k}": ""
                for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
            },
            "reason": "",
            "reportingComponent": "rc",
            "source": "rc",
            "type": "",
        },
    ),
    (
        ("events.k8s.io", "events"),
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "regarding": {"kind": "Pod", "name": "p", "uid": "u"},
            "reportingController": "ctl",
            "deprecatedSource": {"component": "kubelet"},
            "reason": "R",
            "type": "Warning",
        },
        {
            "metadata.name": "e",
            "metadata.namespace": "ns",
            "involvedObject.kind": "Pod",
            "involvedObject.namespace": "",
            "involvedObject.name": "p",
            "involvedObject.uid": "u",
            "involvedObject.apiVersion": "",
            "involvedObject.resourceVersion": "",
            "involvedObject.fieldPath": "",
            "reason": "R",
            "reportingComponent": "ctl",
            "source": "kubelet",
            "type": "Warning",
        },
    ),
    (
        ("", "namespaces"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}, "status": {"phase": "Terminating"}},
        {"metadata.name": "ns", "metadata.namespace": "", "status.phase": "Terminating"},
    ),
    (
        ("", "secrets"),
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns"}, "type": "Opaque"},
        {"metadata.name": "s", "metadata.namespace": "ns", "type": "Opaque"},
    ),
    (
        ("", "services"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": {"clusterIP": "10.0.0.3", "type": "ClusterIP"},
        },
        {"metadata.name": "s", "metadata.namespace": "ns", "spec.clusterIP": "10.0.0.3", "spec.type": "ClusterIP"},
    ),
    (
        ("batch", "jobs"),
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns"},
            "status": {"succeeded": 2},
        },
        {"metadata.name": "j", "metadata.namespace": "ns", "status.successful": "2"},
    ),
    (
        ("certificates.k8s.io", "certificatesigningrequests"),
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": "c"},
            "spec": {"signerName": "example.com/s"},
        },
        {"metadata.name": "c", "metadata.namespace": "", "spec.signerName": "example.com/s"},
    ),
    (
        ("certificates.k8s.io", "clustertrustbundles"),
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "ClusterTrustBundle",
            "metadata": {"name": "c"},
            "spec": {"signerName": "example.com/s"},
        },
        {"metadata.name": "c", "metadata.namespace": "", "spec.signerName": "example.com/s"},
    ),
    (
        ("certificates.k8s.io", "podcertificaterequests"),
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "PodCertificateRequest",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"signerName": "example.com/s", "podName": "p", "nodeName": "n"},
        },
        {
            "metadata.name": "c",
            "metadata.namespace": "ns",
            "spec.signerName": "example.com/s",
            "spec.podName": "p",
            "spec.nodeName": "n",
        },
    ),
    (
        ("resource.k8s.io", "resourceslices"),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "r"},
            "spec": {"driver": "d", "nodeName": "n", "pool": {"name": "p"}},
        },
        {
            "metadata.name": "r",
            "metadata.namespace": "",
            "spec.nodeName": "n",
            "spec.driver": "d",
            "spec.pool.name": "p",
        },
    ),
    (
        ("resource.k8s.io", "resourceslices"),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "r"},
            "spec": {"driver": "d", "allNodes": True, "pool": {"name": "p"}},
        },
        {
            "metadata.name": "r",
            "metadata.namespace": "",
            "spec.nodeName": "",
            "spec.driver": "d",
            "spec.pool.name": "p",
        },
    ),
    (
        ("apps", "deployments"),
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"}},
        {"metadata.name": "d", "metadata.namespace": "ns"},
    ),
    (
        ("", "persistentvolumes"),
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv"}},
        {"metadata.name": "pv", "metadata.namespace": ""},
    ),
]


@pytest.fixture(scope="module")
def to_message() -> Any:
    schema = load_schema()
    codec = ProtobufCodec(schema)

    def convert(obj: dict[str, Any]) -> Any:
        env = decode_envelope(codec.from_json(obj))
        full = schema.lookup_kind(env.api_version, env.kind)
        assert full is not None
        return schema.message_class(full).FromString(env.raw)

    return convert


@pytest.mark.parametrize(("key", "obj", "want"), CASES)
def test_extractors(key: tuple[str, str], obj: dict[str, Any], want: dict[str, str], to_message: Any) -> None:
    sf = builtin_fields(*key)
    assert sf.from_dict(obj) == want
    assert sf.from_message(to_message(obj)) == want
    assert sf.names == frozenset(want)


def test_every_builtin_kind_has_an_extractor_case() -> None:
    assert set(ACCEPTED) <= {key for key, _, _ in CASES}


def test_selection_on_extracted_fields(to_message: Any) -> None:
    pods = builtin_fields("", "pods")
    for text, want in [
        ("spec.host=node-a", True),
        ("spec.hostNetwork=true,status.phase=Running", True),
        ("status.podIPs=", True),  # accepted, never filled: always ""
        ("status.podIPs=10.0.0.1", False),
        ("status.podIP=fd00::1", False),
    ]:
        sel = parse_field_selector(text, pods)
        assert sel.matches(pods.from_dict(POD)) is want, text
        assert sel.matches(pods.from_message(to_message(POD))) is want, text


# --------------------------------------------------------------------------- custom resources


def test_crd_fields() -> None:
    sf = crd_fields([".spec.color", ".spec.size", ".spec.enabled", ".spec.ratio", ".status.deep.x"])
    assert set(sf.accepted) == {
        "metadata.name",
        "metadata.namespace",
        "spec.color",
        "spec.size",
        "spec.enabled",
        "spec.ratio",
        "status.deep.x",
    }
    obj = {
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"color": "red", "size": 3, "enabled": False, "ratio": 1.5},
        "status": {"deep": None},
    }
    assert sf.from_dict(obj) == {
        "metadata.name": "w",
        "metadata.namespace": "ns",
        "spec.color": "red",
        "spec.size": "3",
        "spec.enabled": "false",
        "spec.ratio": "1.5",
        "status.deep.x": "",
    }
    with pytest.raises(SelectorError) as info:
        sf.convert("spec.shape")
    assert str(info.value) == "field label not supported: spec.shape"
    with pytest.raises(TypeError):
        sf.from_message(object())


def test_cluster_scoped_crd_rejects_namespace() -> None:
    sf = crd_fields([], namespaced=False)
    assert set(sf.accepted) == {"metadata.name"}
    with pytest.raises(SelectorError):
        parse_field_selector("metadata.namespace=", sf)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        ("s", "s"),
        (True, "true"),
        (0, "0"),
        (-12, "-12"),
        (2.0, "2"),
        (1.5, "1.5"),
        (999999.0, "999999"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (1e21, "1e+21"),
        (1e-5, "1e-05"),
        (1.5e-7, "1.5e-07"),
        (0.0001, "0.0001"),
        (0.00012, "0.00012"),
        (-2.5, "-2.5"),
        (123.456, "123.456"),
    ],
)
def test_go_sprint(value: Any, text: str) -> None:
    assert F._go_sprint(value) == text


@pytest.mark.parametrize(("minor", "accepted"), [(None, True), (37, True), (38, True), (36, False), (35, False)])
def test_a_field_label_newer_than_the_upstream_is_refused_as_it_refuses_it(minor: int | None, accepted: bool) -> None:
    """ResourceSlice's ``spec.pool.name`` came in 1.37: for an older upstream the cache refuses it
    (and passes the request on, for the apiserver's own 400); its other fields stay."""
    slices = builtin_fields("resource.k8s.io", "resourceslices").at(minor)
    assert slices.convert("spec.driver") == "spec.driver"
    if accepted:
        assert parse_field_selector("spec.pool.name=p", slices).terms == (("spec.pool.name", "p", True),)
    else:
        with pytest.raises(SelectorError, match="Kind=ResourceSlice: spec.pool.name"):
            parse_field_selector("spec.pool.name=p", slices)
    assert builtin_fields("resource.k8s.io", "resourceslices").at(36) is slices.at(36)  # one view per minor
    assert builtin_fields("", "pods").at(35) is builtin_fields("", "pods")  # nothing newer: itself
