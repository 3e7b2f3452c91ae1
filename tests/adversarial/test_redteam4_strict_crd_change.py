"""Strict field validation by policy while a CRD's schema changes under kproxy, which now follows
the process's one CRD feed (kproxy/core/crdfeed.py) instead of a watch of its own: a field the new
schema no longer declares, sent with ``fieldValidation=Ignore`` right after the change (while
kproxy may still hold the old OpenAPI document), is never persisted. The verdict is at the
apiserver (a direct GET as the admin): the policy raises the level sent upstream to Strict, so
the apiserver judges with its own, current schema whatever kproxy's copy says."""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

from . import accounts
from .conftest import POLICY_FILTERS, Twins, start_capped
from .h2edge import Wire

JSON = [("content-type", "application/json")]


def _gizmo(group: str, name: str, **spec: str) -> bytes:
    return json.dumps({"apiVersion": f"{group}/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": spec}).encode()


@pytest.fixture
def strict(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_capped(tmp_path_factory.mktemp("rt4-strict"), control_plane, tls=True, credentials="impersonate",
                      extra={"filters": POLICY_FILTERS["strict"]})  # fmt: skip
    yield rp
    rp.stop()


@pytest.mark.parametrize("change", ["update", "recreate"])
def test_a_field_the_changed_crd_dropped_is_never_persisted(
    change: str, control_plane: ControlPlaneInfo, twins: Twins, strict: RunningProxy
) -> None:
    cp = control_plane
    group = f"rt4{secrets.token_hex(3)}.kproxy.test"
    name = f"gizmos.{group}"
    definition = crds.crd(group, "gizmos", "Gizmo", spec_fields={"a": "string", "b": "string"})
    crds.install(cp, definition)
    try:
        rules: list[dict[str, Any]] = [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]},
            {"apiGroups": [group], "resources": ["gizmos"], "verbs": ["*"]},
        ]
        token = accounts.account_with_role(cp, twins.via, f"rt4-gz-{secrets.token_hex(2)}", rules)
        coll = f"/apis/{group}/v1/namespaces/{twins.via}/gizmos"

        def post(obj: bytes, query: str) -> tuple[str | None, bool]:
            with Wire.to(strict.url) as w:
                st = w.request("POST", f"{coll}?{query}", token, JSON, obj)
            return st.status, not any(k.lower() == "audit-id" for k, _ in st.headers)

        # kproxy holds the schema with spec.b: it answers an unknown spec.c itself.
        eventually(lambda: post(_gizmo(group, "warm", a="1", b="2", c="3"), "dryRun=All") == ("400", True),
                   30, "kproxy's local Strict answer")  # fmt: skip

        narrowed = copy.deepcopy(definition)
        del narrowed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["b"]
        if change == "update":
            current = json.loads(cp.request("GET", f"{crds.CRDS}/{name}")[1])
            current["spec"] = narrowed["spec"]
            code, body = cp.request("PUT", f"{crds.CRDS}/{name}", body=json.dumps(current).encode())
            assert code == 200, body
        else:
            crds.uninstall(cp, name)
            eventually(lambda: cp.request("GET", f"{crds.CRDS}/{name}")[0] == 404, 30, "the CRD gone")
            crds.install(cp, narrowed)

        def apiserver_refuses_b() -> bool:
            code, _ = cp.request("POST", f"{coll}?dryRun=All&fieldValidation=Strict",
                                 body=_gizmo(group, "probe", a="1", b="2"))  # fmt: skip
            return code == 400

        eventually(apiserver_refuses_b, 30, "the apiserver's Strict refusal of spec.b")
        names = [f"g{i}-{secrets.token_hex(2)}" for i in range(20)]
        answers = [post(_gizmo(group, n, a="1", b="2"), "fieldValidation=Ignore")[0] for n in names]
        persisted = [n for n in names if cp.request("GET", f"{coll}/{n}")[0] != 404]
        assert not persisted, f"persisted despite the Strict policy: {persisted} (answers {answers})"
        assert set(answers) == {"400"}, answers
        assert "Traceback" not in strict.log_text()
    finally:
        crds.uninstall(cp, name)
