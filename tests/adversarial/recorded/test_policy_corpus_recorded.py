"""The hostile-request corpus (``cases.py``) through kproxy's real ``ProxyServer`` and policy
filters in the test process, in front of the recorded apiserver answers
(``kproxy.testing.replay``): no control plane, a few seconds, so it runs before every commit.

Each case is sent once per policy it names, as raw bytes, and two invariants are checked:

* ``forwarded`` -- no write reached the upstream that the apiserver would carry out although the
  policy forbids it: under ``enforce`` and ``reject`` every POST, PUT, PATCH and DELETE that
  reached it is a dry run as the apiserver reads one (every ``dryRun`` value of the query ``All``,
  as Go's ``url.ParseQuery`` splits it; a DELETE with a body has the body's DeleteOptions and
  its query is not read: ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go``); under
  ``strict`` every write carries ``fieldValidation=Strict`` first (a string option takes the
  query's first value: ``Convert_Slice_string_To_string`` in
  ``staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go``);
* ``answer`` -- kproxy answered every case, never with a 5xx of its own, and logged no
  traceback. (Whether a refusal has the apiserver's shape needs the apiserver's own answer: the
  e2e corpus compares them.)

Cases with a ``Content-Encoding`` are left to the e2e corpus: the recorded upstream's HTTP server
decodes a request body's encoding, the apiserver does not.

The body readers here are the test's own (``json``, PyYAML, a protobuf field walk), not kproxy's;
the query is read with ``kproxy.gocompat.url.query_values``, which tests/unit/gocompat/test_gocompat_url.py
checks against Go's ``url.ParseQuery``.
The authority stays ``tests/adversarial/test_policy_corpus.py``, which checks the same corpus at
the real apiserver (what was persisted); cases it knows to fail are strict xfails here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import pytest
import yaml

from kproxy.gocompat.url import query_values
from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.proxyproc import TEST_HOSTS
from kproxy.testing.replay import Received, ReplayUpstream

from ..cases import CASES
from ..conftest import POLICY_FILTERS
from ..wire import TIMEOUT, Answer, Endpoint, exchange, request_bytes

NS, SA = "rec", "adv-sa"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
#: Groups whose every resource is a review the apiserver answers and keeps nothing of (kproxy's own
#: identity and access checks go there: pkg/registry/authentication, pkg/registry/authorization).
REVIEWS = ("/apis/authentication.k8s.io/", "/apis/authorization.k8s.io/")


@dataclass
class Outcome:
    raw: bytes
    answer: Answer
    forwarded: list[Received]
    tracebacks: list[str]

    def repro(self) -> str:
        return f"raw={self.raw[:2000]!r}"


_OUTCOMES: dict[tuple[str, int], Outcome] = {}
_PROXIES: dict[str, tuple[InProcessProxy, ReplayUpstream]] = {}


@pytest.fixture(scope="module")
async def started() -> AsyncIterator[dict[str, tuple[InProcessProxy, ReplayUpstream]]]:
    async with AsyncExitStack() as stack:
        for policy, filters in POLICY_FILTERS.items():
            config = {"filters": filters, "proxy": {"accept_hosts": TEST_HOSTS}}  # as the e2e proxies
            _PROXIES[policy] = await stack.enter_async_context(inprocess_proxy(config))
        yield _PROXIES
        _PROXIES.clear()


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.seen.append(self.format(record))


async def outcome(policy: str, index: int, proxies: dict[str, tuple[InProcessProxy, ReplayUpstream]]) -> Outcome:
    key = (policy, index)
    if key in _OUTCOMES:
        return _OUTCOMES[key]
    case = CASES[index]
    proxy, upstream = proxies[policy]
    name, seed = f"new-{policy}-{index}", f"seed-{policy}-{index}"
    target, headers, body = case.render(NS, name, seed, SA)
    raw = request_bytes(case.method, target, headers, body)
    handler = _Tracebacks()
    logging.getLogger().addHandler(handler)
    before = len(upstream.received)
    try:
        answer = await asyncio.to_thread(exchange, Endpoint.from_url(proxy.url), raw)
        await asyncio.sleep(0)
    finally:
        logging.getLogger().removeHandler(handler)
    out = Outcome(raw, answer, upstream.received[before:], handler.seen)
    _OUTCOMES[key] = out
    return out


def _params(invariant: str) -> list[object]:
    """The cases under each policy they name; a case the e2e corpus knows to fail this invariant
    (``known``) is a strict xfail. The e2e ``answer`` invariant's known failures are about the
    shape of a refusal, which needs the apiserver to compare with: not checked here."""
    out = []
    for i, case in enumerate(CASES):
        if any(k.lower() == "content-encoding" for k, _ in case.headers):
            continue  # the recorded upstream (aiohttp) decodes a request's Content-Encoding; the apiserver does not
        for policy in case.policies:
            known = case.known if invariant == "policy" else {}
            reason = known.get(f"{invariant}@{policy}", known.get(invariant))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(policy, i, id=f"{policy}-{case.id}", marks=marks))
    return out


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _protobuf_dry_run(data: bytes) -> list[str] | None:
    """DeleteOptions.dryRun (field 5) of a protobuf envelope (k8s\\x00, Unknown{raw=2}); None
    when the bytes are not one."""

    def fields(buf: bytes) -> list[tuple[int, bytes]] | None:
        out, i = [], 0
        while i < len(buf):
            key, i = _varint(buf, i)
            if key is None:
                return None
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, i = _varint(buf, i)
                if _ is None:
                    return None
                continue
            if wire != 2:
                return None
            size, i = _varint(buf, i)
            if size is None or i + size > len(buf):
                return None
            out.append((number, buf[i : i + size]))
            i += size
        return out

    if not data.startswith(b"k8s\x00"):
        return None
    unknown = fields(data[4:])
    raw = next((v for n, v in unknown or [] if n == 2), None)
    inner = fields(raw) if raw is not None else None
    if inner is None:
        return None
    return [v.decode("utf-8", "replace") for n, v in inner if n == 5]


def _varint(buf: bytes, i: int) -> tuple[int | None, int]:
    value = shift = 0
    while i < len(buf):
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
    return None, i


def _body_dry_run(req: Received) -> tuple[bool, list[str] | None]:
    """(whether the apiserver would decode this DELETE body at all, its dryRun or None if it
    names none). The apiserver decodes DeleteOptions from JSON, YAML and protobuf only (any other
    media type is refused with 415, nothing deleted)."""
    mt = _media_type(req.headers.get("Content-Type"))
    if mt == "application/vnd.kubernetes.protobuf":
        got = _protobuf_dry_run(req.body)
        return (got is not None, got or None)
    if mt in ("application/json", "application/yaml", ""):
        try:
            doc = json.loads(req.body) if mt != "application/yaml" else next(yaml.safe_load_all(req.body), None)
        except (ValueError, yaml.YAMLError):
            return (False, None)  # the apiserver answers 400: nothing deleted
        if not isinstance(doc, dict):
            return (doc is not None, None)
        dry = doc.get("dryRun")
        return (True, [str(v) for v in dry] if isinstance(dry, list) else None if dry is None else [str(dry)])
    return (False, None)


def _prefix_verb(raw_path: str) -> bool:
    """Whether the path names a verb by its prefix (``/api/v1/watch/...``, ``/apis/g/v/proxy/...``):
    the apiserver routes no write there (RequestInfo's ``specialVerbs`` in
    staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go; installer.go registers the
    watch prefix for GET only, and the proxy prefix no more)."""
    parts = urllib.parse.unquote(raw_path).strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else []
    return rest[:1] in (["watch"], ["proxy"])


def violation(policy: str, req: Received) -> str | None:
    """Why this forwarded request would be carried out by the apiserver although ``policy``
    forbids it, or None."""
    if req.method not in WRITES or req.path.startswith(REVIEWS) or _prefix_verb(req.path):
        return None
    if not req.path.startswith("/"):
        # ``*`` (Go reads it as the path): the apiserver routes no path that does not begin with a
        # slash, so nothing is written (tests/adversarial/test_policy_corpus.py shows it persisting nothing).
        return None
    query = query_values(req.target.partition("?")[2])
    if policy == "strict":
        fv = query.get("fieldValidation", [])
        return None if fv[:1] == ["Strict"] else f"{req.method} {req.target} forwarded without fieldValidation=Strict"
    dry = query.get("dryRun", [])
    if req.method == "DELETE" and req.body:
        decoded, from_body = _body_dry_run(req)
        if not decoded:
            return None
        dry = from_body or []  # a body's options replace the query's (the query is not read at all)
    if dry and all(v == "All" for v in dry):
        return None
    return f"{req.method} {req.target} forwarded as a real write (dryRun {dry}); body {req.body[:200]!r}"


@pytest.mark.parametrize(("policy", "index"), _params("policy"))
async def test_nothing_forbidden_reaches_the_upstream(
    policy: str, index: int, started: dict[str, tuple[InProcessProxy, ReplayUpstream]]
) -> None:
    out = await outcome(policy, index, started)
    bad = [v for v in (violation(policy, r) for r in out.forwarded) if v]
    assert not bad, f"{bad}; kproxy answered {out.answer.short()}; {out.repro()}"


@pytest.mark.parametrize(("policy", "index"), _params("answer"))
async def test_kproxy_answers_every_case(
    policy: str, index: int, started: dict[str, tuple[InProcessProxy, ReplayUpstream]]
) -> None:
    out = await outcome(policy, index, started)
    answer = out.answer
    detail = f"kproxy: {answer.short()}; forwarded {[(r.method, r.target) for r in out.forwarded]}; {out.repro()}"
    assert answer.status != TIMEOUT and answer.status > 0, detail
    if not out.forwarded:  # kproxy's own answer
        assert answer.status < 500, detail
    assert not out.tracebacks, f"{detail}\n{out.tracebacks[0][-3000:]}"
