"""The corpus, sent straight to the apiserver and through kproxy at every fieldValidation level:
identical status codes, Status bodies and ``Warning`` headers.

Two kproxy processes run the ``validation`` filter: one in front of an upstream that validates
(kproxy answers Strict POST/PUT failures itself, everything else is the apiserver's), and one
told the upstream does not know ``fieldValidation`` (kproxy sends it ``Ignore`` and provides the
Warn warnings and Strict errors of POST/PUT itself: the engine's output alone is compared).
A kproxy answer is recognised by the missing ``Audit-Id`` header the apiserver always sets.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest_asyncio
from validation_corpus.cases import BASE_OBJECTS, CASES, Case
from validation_corpus.crds import CRDS, GROUP

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually_async
from kproxy.testing.proxyproc import RunningProxy

LEVELS: list[str | None] = [None, "Ignore", "Warn", "Strict"]

#: Differences known and explained (docs/using/validation.md); they count as mismatches in the rate.
KNOWN: dict[tuple[str, str], str] = {}


@dataclass
class Answer:
    status: int
    body: bytes
    warnings: list[str]
    local: bool

    def comparable(self) -> tuple[int, Any, list[str]]:
        """Error bodies byte for byte; success bodies without the per-request values (uid, times);
        YAML and protobuf success bodies (which carry those values inside) by status and warnings."""
        if self.status < 300:
            try:
                obj = json.loads(self.body)
            except ValueError:
                return self.status, None, self.warnings
            meta = obj.get("metadata") or {}
            for key in ("uid", "creationTimestamp", "managedFields", "resourceVersion", "generation"):
                meta.pop(key, None)
            return self.status, obj, self.warnings
        return self.status, self.body, self.warnings


async def send(
    session: aiohttp.ClientSession, base: str, case: Case, namespace: str, level: str | None, ssl: Any
) -> Answer:
    headers = {"Content-Type": case.content_type, "Accept": case.accept, "User-Agent": "validation-corpus/1.0"}
    async with session.request(
        case.method, base + case.target(namespace, level), data=case.body, headers=headers, ssl=ssl
    ) as resp:
        body = await resp.read()
        return Answer(resp.status, body, resp.headers.getall("Warning", []), "Audit-Id" not in resp.headers)


@pytest_asyncio.fixture
async def corpus_namespace(control_plane: ControlPlaneInfo, namespace: str) -> AsyncIterator[str]:
    """The namespace with the CRDs established and the base objects the PUT/PATCH cases target."""
    for crd in CRDS:
        code, body = control_plane.request(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=json.dumps(crd).encode()
        )
        assert code in (201, 409), body
    for crd in CRDS:
        await _wait_established(control_plane, crd["metadata"]["name"])
    for api, obj in BASE_OBJECTS:
        plural = {"ConfigMap": "configmaps", "Deployment": "deployments", "Service": "services", "Widget": "widgets"}[
            obj["kind"]
        ]
        # A CRD's REST endpoint appears shortly after Established.
        await eventually_async(
            lambda api=api, obj=obj, plural=plural: control_plane.request(
                "POST", f"{api}/namespaces/{namespace}/{plural}", body=json.dumps(obj).encode()
            ),
            10,
            f"a {obj['kind']} to be created",
            0.2,
            until=lambda answer: answer[0] == 201,
        )
    yield namespace


async def _wait_established(cp: ControlPlaneInfo, name: str) -> None:
    def conditions() -> list[dict[str, Any]]:
        code, body = cp.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conds: list[dict[str, Any]] = json.loads(body).get("status", {}).get("conditions", []) if code == 200 else []
        return conds

    await eventually_async(
        conditions,
        20,
        f"the CRD {name} to be established",
        0.2,
        until=lambda conds: any(c["type"] == "Established" and c["status"] == "True" for c in conds),
    )


async def _schemas_ready(session: aiohttp.ClientSession, base: str, ssl: Any) -> None:
    """The CRDs' OpenAPI documents are published a moment after the CRDs are established."""

    async def published() -> bool:
        async with session.get(base + f"/openapi/v3/apis/{GROUP}/v1", ssl=ssl) as resp:
            return resp.status == 200 and b'"Gadget"' in await resp.read()

    await eventually_async(published, 20, "the custom resources' OpenAPI document", 0.2)


def _validation_proxy(factory: Callable[..., RunningProxy], **settings: Any) -> RunningProxy:
    # settle_seconds 0: the corpus CRDs are created before kproxy starts and never change.
    return factory(extra={"filters": [{"name": "validation", "settle_seconds": 0, **settings}]})


async def test_validation_corpus_matches_apiserver(
    control_plane: ControlPlaneInfo,
    corpus_namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    record_property: Callable[[str, object], None],
) -> None:
    assert len(CASES) >= 100
    ns = corpus_namespace
    direct_ssl = control_plane.ssl_context()
    async with aiohttp.ClientSession() as session:
        await _schemas_ready(session, control_plane.server, direct_ssl)
        local = _validation_proxy(proxy_factory)
        provided = _validation_proxy(proxy_factory, upstream_validates="no")
        compared = mismatched = local_answers = 0
        failures: list[str] = []
        known: set[tuple[str, str]] = set()
        for case in CASES:
            for level in LEVELS:
                direct = await send(session, control_plane.server, case, ns, level, direct_ssl)
                targets = [("local", local)]
                if case.method in ("POST", "PUT"):
                    targets.append(("provided", provided))
                for label, rp in targets:
                    got = await send(session, rp.url, case, ns, level, None)
                    compared += 1
                    local_answers += got.local
                    mine, theirs = got.comparable(), direct.comparable()
                    if mine != theirs:
                        if (case.name, label) in KNOWN:
                            known.add((case.name, label))
                            mismatched += 1
                            continue
                        mismatched += 1
                        failures.append(
                            f"{case.name} [{label}, fieldValidation={level}]\n"
                            f"  direct: {direct.status} {direct.warnings} {direct.body[:600]!r}\n"
                            f"  kproxy: {got.status} {got.warnings} {got.body[:600]!r}"
                        )
    rate = (compared - mismatched) / compared
    record_property("validation_match_rate", f"{compared - mismatched}/{compared}")
    print(f"\nvalidation corpus: {len(CASES)} cases, {compared} comparisons, {compared - mismatched} identical "
          f"({rate:.1%}), {local_answers} answered by kproxy")  # fmt: skip
    with open("/tmp/validation-corpus-failures.txt", "w") as fh:
        fh.write("\n".join(failures))
    assert not failures, "\n".join(failures)
    assert known == set(KNOWN), f"known differences that no longer happen: {set(KNOWN) - known}"
    # The local paths really ran: Strict failures answered without the apiserver, warnings provided.
    assert local_answers >= 50
