"""The dryrun filter after its split into query, DeleteOptions and filter modules, attacked from
outside over HTTP/2: DELETE and deletecollection bodies whose DeleteOptions the apiserver reads
instead of the query (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go), in JSON,
YAML (first document only) and protobuf (the last ``raw`` of the envelope), under ``enforce``
and ``reject``. The verdict is at the apiserver: the object is still there (a direct GET as the
admin). The recorded corpus (tests/adversarial/cases.py) sends its DELETEs over HTTP/1.1."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from kproxy.codec.envelope import encode_envelope, ld
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from . import accounts
from .conftest import POLICY_FILTERS, Twins, start_capped
from .h2edge import Wire

CM_RULES = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]
JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"


def _pb(*raws: bytes) -> bytes:
    """A protobuf DeleteOptions envelope; more than one ``raw`` field when given (Go keeps the last)."""
    body = encode_envelope("v1", "DeleteOptions", raws[0])
    for raw in raws[1:]:
        body += ld(2, raw)
    return body


ALL = ld(5, b"All")

#: (Content-Type, body, query): none of them is a dry run at the apiserver unless kproxy makes it one.
BODIES: dict[str, tuple[str, bytes, str]] = {
    "json-empty": (JSON, b"{}", ""),
    "json-empty-query-all": (JSON, b"{}", "dryRun=All"),
    "json-dryrun-empty": (JSON, b'{"dryRun":[]}', "dryRun=All"),
    "json-dryrun-null": (JSON, b'{"dryRun":null}', "dryRun=All"),
    "json-case-key": (JSON, b'{"DryRun":["All"]}', ""),
    "json-duplicate-last-empty": (JSON, b'{"dryRun":["All"],"dryRun":[]}', ""),
    "json-null": (JSON, b"null", "dryRun=All"),
    "yaml-second-document": (YAML, b"kind: DeleteOptions\n---\ndryRun: [All]\n", ""),
    "yaml-charset": ("application/yaml; charset=utf-8", b"propagationPolicy: Background\n", "dryRun=All"),
    "protobuf-none": (PROTOBUF, _pb(b""), "dryRun=All"),
    "protobuf-last-raw-empty": (PROTOBUF, _pb(ALL, b""), ""),
    "no-content-type": ("", b"{}", "dryRun=All"),
}


@pytest.fixture(scope="module")
def caller(control_plane: ControlPlaneInfo, twins: Twins) -> str:
    return accounts.account_with_role(control_plane, twins.via, f"rt4-{secrets.token_hex(2)}", CM_RULES)


def _proxy(cp: ControlPlaneInfo, factory: pytest.TempPathFactory, policy: str) -> Iterator[RunningProxy]:
    rp = start_capped(factory.mktemp(f"rt4-{policy}"), cp, tls=True, credentials="impersonate",
                      extra={"filters": POLICY_FILTERS[policy]})  # fmt: skip
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def enforce(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    yield from _proxy(control_plane, tmp_path_factory, "enforce")


@pytest.fixture(scope="module")
def reject(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    yield from _proxy(control_plane, tmp_path_factory, "reject")


def _seed(twins: Twins, label: str) -> str:
    name = f"rt4-{secrets.token_hex(4)}"
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"rt4": label}}}
    code, resp = twins.cp.request("POST", f"/api/v1/namespaces/{twins.via}/configmaps", body=json.dumps(body).encode())
    assert code == 201, resp
    return name


@pytest.mark.parametrize("collection", [False, True], ids=["delete", "deletecollection"])
@pytest.mark.parametrize("case", list(BODIES))
@pytest.mark.parametrize("policy", ["enforce", "reject"])
def test_h2_delete_bodies_delete_nothing(
    policy: str, case: str, collection: bool, request: pytest.FixtureRequest, caller: str, twins: Twins
) -> None:
    rp: RunningProxy = request.getfixturevalue(policy)
    ctype, body, query = BODIES[case]
    label = secrets.token_hex(4)
    name = _seed(twins, label)
    coll = f"/api/v1/namespaces/{twins.via}/configmaps"
    if collection:
        path = f"{coll}?labelSelector=rt4%3D{label}" + (f"&{query}" if query else "")
    else:
        path = f"{coll}/{name}" + (f"?{query}" if query else "")
    extra = [("content-type", ctype)] if ctype else []
    try:
        with Wire.to(rp.url) as w:
            st = w.wait(w.open(w.block(w.fields("DELETE", path, caller, extra)), body))
        assert st.status is not None or st.reset is not None, st.short()
        assert twins.get(f"{coll}/{name}") is not None, f"deleted through {policy}: {st.short()}"
        assert "Traceback" not in rp.log_text()
    finally:
        twins.cp.request("DELETE", f"{coll}/{name}")


#: ``:path`` spellings of the configmaps collection ``{c}`` (namespace ``{ns}``) that the apiserver
#: serves as that collection (its path is the decoded one; each creates without the filter), so
#: kproxy's policy must see them as that collection too. (``..`` and dot segments, ``//`` and
#: absolute-form ``:path`` values were tried too: without the filter they create nothing.)
TARGETS = {
    "pct-slash-namespace": "/api/v1/namespaces/{ns}%2Fconfigmaps",
    "pct-slash-resource": "/api/v1/namespaces/{ns}/configmaps%2F",
    "pct-api": "/%61pi/v1/namespaces/{ns}/configmaps",
    "query-only-slash": "{c}?/../../version",
}


@pytest.mark.parametrize("case", list(TARGETS))
def test_h2_target_spellings_persist_nothing(case: str, enforce: RunningProxy, caller: str, twins: Twins) -> None:
    name = f"rt4t-{secrets.token_hex(4)}"
    coll = f"/api/v1/namespaces/{twins.via}/configmaps"
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}).encode()
    path = TARGETS[case].format(ns=twins.via, c=coll)
    try:
        with Wire.to(enforce.url) as w:
            st = w.wait(w.open(w.block(w.fields("POST", path, caller, [("content-type", JSON)])), body))
        assert st.status is not None or st.reset is not None, st.short()
        assert twins.get(f"{coll}/{name}") is None, f"persisted through enforce: {st.short()}"
        assert "Traceback" not in enforce.log_text()
    finally:
        twins.cp.request("DELETE", f"{coll}/{name}")
