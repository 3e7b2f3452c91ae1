"""Every case of the corpus (cases.py) under every policy it names, sent as raw bytes through a
real kproxy and, for comparison, to the apiserver directly in the twin namespace. Each case is
sent once; each invariant is its own parametrized test on the recorded outcome:

* ``policy`` -- nothing persisted that the policy forbade (checked by a direct GET as admin);
* ``answer`` -- kproxy stayed up, answered, answered a Status where the apiserver answers one,
  gave no 5xx where the apiserver did not, and logged no traceback;

and, after the corpus, another caller's list through each kproxy is still the apiserver's.

Adding a case is one line in cases.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kproxy.testing.proxyproc import RunningProxy

from .cases import CASES, Case
from .conftest import Twins
from .wire import TIMEOUT, Answer, Endpoint, exchange, request_bytes


@dataclass
class Outcome:
    raw: bytes
    via: Answer
    direct: Answer
    persisted: str | None
    alive: bool
    log: str

    def repro(self) -> str:
        return f"raw={self.raw[:2000]!r}"


_OUTCOMES: dict[tuple[str, str], Outcome] = {}


def _params(invariant: str) -> list[object]:
    out = []
    for i, case in enumerate(CASES):
        for policy in case.policies:
            reason = case.known.get(f"{invariant}@{policy}", case.known.get(invariant))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(policy, i, id=f"{policy}-{case.id}", marks=marks))
    return out


def _violation(case: Case, twins: Twins, via_ns: str, name: str, seed: str, answer: Answer) -> str | None:
    """What the case persisted (or obtained) that the policy forbade, or None."""
    if case.kind == "create":
        obj = twins.get(f"/api/v1/namespaces/{via_ns}/configmaps/{name}")
        return None if obj is None else f"configmap {name} was created: {json.dumps(obj)[:300]}"
    if case.kind == "modify":
        obj = twins.get(f"/api/v1/namespaces/{via_ns}/configmaps/{seed}")
        if obj is None:
            return f"seed {seed} was deleted"
        if obj["metadata"].get("deletionTimestamp") or obj["metadata"]["resourceVersion"] != _SEED_RV[seed]:
            return f"seed {seed} was changed: {json.dumps(obj)[:300]}"
        return None
    doc = answer.json()
    if isinstance(doc, dict) and doc.get("kind") == "TokenRequest" and doc["status"].get("token"):
        return "a real service-account token was handed out"
    return None


_SEED_RV: dict[str, str] = {}


def outcome(policy: str, index: int, get_proxy: Callable[[str], RunningProxy], twins: Twins) -> Outcome:
    """Send case ``index`` under ``policy`` once (memoized) and record what happened."""
    key = (policy, str(index))
    if key in _OUTCOMES:
        return _OUTCOMES[key]
    case = CASES[index]
    rp = get_proxy(policy)
    name, seed = f"new-{policy}-{index}", f"seed-{policy}-{index}"
    if case.kind == "modify":
        twins.seed(seed)
        obj = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/{seed}")
        assert obj is not None
        _SEED_RV[seed] = obj["metadata"]["resourceVersion"]

    def raw(ns: str) -> bytes:
        target, headers, body = case.render(ns, name, seed, twins.sa)
        return request_bytes(case.method, target, headers, body)

    log_from = rp.log.stat().st_size
    via_raw = raw(twins.via)
    via = exchange(Endpoint.from_url(rp.url), via_raw)
    direct = exchange(twins.direct_endpoint, raw(twins.direct))
    alive = rp.proc.poll() is None
    with rp.log.open("rb") as f:
        f.seek(log_from)
        log = f.read().decode(errors="replace")
    result = Outcome(via_raw, via, direct, _violation(case, twins, twins.via, name, seed, via), alive, log)
    _OUTCOMES[key] = result
    return result


@pytest.mark.parametrize(("policy", "index"), _params("policy"))
def test_policy_holds(policy: str, index: int, policy_proxies: Callable[[str], RunningProxy], twins: Twins) -> None:
    """Nothing the policy forbade was persisted (or handed out), checked at the apiserver."""
    out = outcome(policy, index, policy_proxies, twins)
    assert out.persisted is None, f"{out.persisted}; kproxy answered {out.via.short()}; {out.repro()}"


@pytest.mark.parametrize(("policy", "index"), _params("answer"))
def test_kproxy_answers_like_the_apiserver(
    policy: str, index: int, policy_proxies: Callable[[str], RunningProxy], twins: Twins
) -> None:
    """kproxy stayed up and answered: a Status where the apiserver answers a Status, no 5xx where
    the apiserver gave none, no traceback in its log."""
    out = outcome(policy, index, policy_proxies, twins)
    via, direct = out.via, out.direct
    detail = f"kproxy: {via.short()}; apiserver: {direct.short()}; {out.repro()}"
    assert out.alive, f"kproxy exited; {detail}"
    assert via.status != TIMEOUT or direct.status == TIMEOUT, detail
    assert via.status < 500 or direct.status >= 500, detail
    if via.status >= 400 and direct.is_status():
        assert via.is_status(), detail
    assert "Traceback" not in out.log, f"{detail}\n{out.log[-3000:]}"


@pytest.mark.parametrize("policy", ["enforce", "reject", "strict"])
def test_other_callers_reads_unaffected(
    policy: str, policy_proxies: Callable[[str], RunningProxy], twins: Twins
) -> None:
    """After the whole corpus, another caller's list through the same kproxy is the apiserver's list."""
    raw = request_bytes("GET", f"/api/v1/namespaces/{twins.via}/configmaps", [("Accept", "application/json")])
    via = exchange(Endpoint.from_url(policy_proxies(policy).url), raw)
    direct = exchange(twins.direct_endpoint, raw)
    assert via.status == direct.status == 200, (via.short(), direct.short())
    names = [sorted(i["metadata"]["name"] for i in a.json()["items"]) for a in (via, direct)]
    assert names[0] == names[1]
