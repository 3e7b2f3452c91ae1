"""No false alarms: every object of the fidelity corpus (about 40 built-in kinds, every special
type), read back from the apiserver and written again with fieldValidation=Strict, is accepted
through kproxy as directly (kproxy finds nothing to report and lets it through); the same objects
with one unknown field are answered by kproxy itself, identical to the apiserver's 400."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import aiohttp
import pytest
from corpus import CorpusObject, cleanup, load

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy


@pytest.fixture
def corpus_objects(control_plane: ControlPlaneInfo, namespace: str) -> Iterator[list[CorpusObject]]:
    objs = load(control_plane, namespace)
    yield objs
    cleanup(control_plane, objs)


async def test_read_back_objects_are_not_flagged(
    control_plane: ControlPlaneInfo, corpus_objects: list[CorpusObject], proxy_factory: Callable[..., RunningProxy]
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "validation"}]})
    direct_ssl = cp.ssl_context()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    kinds_answered_locally = set()
    async with aiohttp.ClientSession() as s:

        async def put(base: str, obj: CorpusObject, body: bytes, ssl: object) -> tuple[int, bytes, bool]:
            url = f"{base}{obj.path}?dryRun=All&fieldValidation=Strict"
            async with s.put(url, data=body, headers=headers, ssl=ssl) as r:
                return r.status, await r.read(), "Audit-Id" not in r.headers

        for obj in corpus_objects:
            code, raw = cp.request("GET", obj.path)
            assert code == 200, raw
            current = json.loads(raw)
            body = json.dumps(current).encode()
            direct = await put(cp.server, obj, body, direct_ssl)
            via = await put(rp.url, obj, body, None)
            # Forwarded (nothing to report), so whatever the apiserver says (200, or 422 for
            # a ControllerRevision whose data is immutable) is said once, by the apiserver.
            # (Success bodies carry the time of the request in managedFields: compare codes.)
            same = via[0] == direct[0] and (direct[0] < 300 or via[1] == direct[1])
            assert direct[0] != 400 and same and not via[2], (obj, direct, via)
            broken = json.dumps({**current, "zzUnknown": 1, "spec": current.get("spec", {})}).encode()
            if "spec" not in current:
                broken = json.dumps({**current, "zzUnknown": 1}).encode()
            direct = await put(cp.server, obj, broken, direct_ssl)
            via = await put(rp.url, obj, broken, None)
            assert direct[0] == 400 and via[:2] == direct[:2], (obj, direct, via)
            if via[2]:
                kinds_answered_locally.add(obj.kind)
    assert len(kinds_answered_locally) >= 30, kinds_answered_locally
