"""A differential fuzzer: well-formed requests mutated (target, query, method, headers, body) with a
fixed seed, each sent as the same raw bytes to the apiserver directly and through kproxy, in twin
namespaces whose names have the same length.

Two kproxy chains are fuzzed:

* ``transparent`` (compression, watchcache, transcode): kproxy must answer with the apiserver's
  status class, never a 5xx the apiserver did not give, a Status wherever the apiserver answers one;
  both sides see the same request sequence, so their states stay the same.
* ``policy`` (dryrun enforce, validation Strict, for every caller): nothing kproxy forwarded may
  persist anything (etcd is read after every request), no service-account token handed out, a
  write the apiserver warns about unknown or duplicate fields must not succeed, and no 5xx where
  the apiserver gave none. Status classes may differ (the twin namespace is really written).
* ``identity`` (``credentials: forward``; dryrun enforce and Strict validation for the namespace's
  service account, and a dryrun ``reject`` rule for its SelfSubjectReviews): requests carry the
  service account's token in the spellings Go reads (Unicode white space around ``Bearer``,
  scheme case, several ``Authorization`` lines, the WebSocket bearer protocol behind ``Upgrade``
  and ``Connection`` spellings, protocol lists with white space, padding, two tokens). The judge
  is the apiserver: a SelfSubjectReview sent straight to it names whom it saw; kproxy's rule
  refusing the service account's review shows whom kproxy saw; the two must agree, and the
  checks of ``policy`` hold (nothing persisted, Strict held).

Each request is generated from ``random.Random(f"{seed}:{index}")`` alone, so any failure is
reproduced from its seed and index; the report also prints the raw bytes as a Python literal.

Run longer than CI does::

    KPROXY_ENVTEST_DIR=... python -m tests.adversarial.fuzz --count 50000 [--target policy] [--seed 1]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import random
import re
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

from . import bodies as b
from .wire import CLOSED, TIMEOUT, Answer, Endpoint, exchange, request_bytes

CHAINS: dict[str, list[dict[str, Any]]] = {
    "transparent": [
        {"name": "compression"},
        {"name": "watchcache", "resources": ["configmaps"]},
        {"name": "transcode", "upstream": "protobuf"},
    ],
    "policy": [
        {"name": "dryrun", "rules": [{"name": "fuzz", "action": "enforce"}]},
        {"name": "validation", "rules": [{"name": "fuzz", "level": "Strict"}]},
    ],
    "identity": [
        {"name": "dryrun", "rules": [
            {"name": "fz-seen", "match": {"users": ["system:serviceaccount:fzk-*:fz-sa"],
                                          "resources": ["selfsubjectreviews.authentication.k8s.io"]},
             "action": "reject"},
            {"name": "fz-sa", "match": {"users": ["system:serviceaccount:fzk-*:fz-sa"]}, "action": "enforce"},
        ]},
        {"name": "validation", "rules": [
            {"name": "fz-sa", "match": {"users": ["system:serviceaccount:fzk-*:fz-sa"]}, "level": "Strict"},
        ]},
    ],
}  # fmt: skip
#: How each chain's kproxy authenticates upstream (the others: its own credentials).
CREDENTIALS = {"identity": "forward"}

SEEDS = ("s0", "s1", "s2", "s3")
SA = "fz-sa"
NS, NAME, SEED = "@NS@", "@NAME@", "@SEED@"
#: The side's service-account token, as is and as the WebSocket bearer protocol's base64url.
TOKEN, WSTOKEN = "@TOKEN@", "@WSTOKEN@"


@dataclass
class Req:
    method: str
    target: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    chunked: bool = False  # frame the body in one chunk once the placeholders are filled in
    utf8: bool = False  # header values are text (UTF-8, surrogateescape for other bytes), not Latin-1

    def render(self, ns: str, name: str, token: str = "") -> bytes:
        ws = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")

        def sub(s: str) -> str:
            return s.replace(NS, ns).replace(NAME, name).replace(TOKEN, token).replace(WSTOKEN, ws)

        headers = [(sub(k), sub(v)) for k, v in self.headers]
        if self.utf8:  # request_bytes writes Latin-1: one character per byte
            headers = [(k, v.encode("utf-8", "surrogateescape").decode("latin-1")) for k, v in headers]
        body = self.body.replace(NS.encode(), ns.encode()).replace(NAME.encode(), name.encode()) if self.body else None
        if self.chunked:
            body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
            headers.append(("Transfer-Encoding", "chunked"))
        return request_bytes(sub(self.method), sub(self.target), headers, body)


# --------------------------------------------------------------------------- well-formed requests

COLL = f"/api/v1/namespaces/{NS}/configmaps"


def _obj(rng: random.Random, unknown: bool) -> dict[str, Any]:
    extra = {"bogusField": "x"} if unknown else {}
    return b.cm(NAME, data={"k": rng.choice(["v", "w", "0", "true"])}, **extra)


def _templates(rng: random.Random) -> Req:
    seed = f"{COLL}/{rng.choice(SEEDS)}"
    unknown = rng.random() < 0.3
    j = [("Content-Type", b.JSON)]
    choice = rng.randrange(15)
    if choice == 0:
        return Req("GET", seed)
    if choice == 1:
        return Req("GET", COLL + rng.choice(["", "?limit=2", "?labelSelector=a%3Db", "?resourceVersion=0"]))
    if choice == 2:
        return Req("POST", COLL, j, json.dumps(_obj(rng, unknown)).encode())
    if choice == 3:
        return Req("POST", COLL, [("Content-Type", b.YAML)], b.cm_yaml(NAME) + (b"bogusField: x\n" if unknown else b""))
    if choice == 4:
        return Req("POST", COLL, [("Content-Type", b.PROTOBUF)], b.cm_protobuf(NAME))
    if choice == 5:
        return Req("POST", COLL, [("Content-Type", b.CBOR)], b.cbor(_obj(rng, unknown)))
    if choice == 6:
        obj = _obj(rng, unknown)
        obj["metadata"]["name"] = seed.rsplit("/", 1)[1]
        return Req("PUT", seed, j, json.dumps(obj).encode())
    if choice == 7:
        patch = b'{"data":{"k":"m"}' + (b',"bogusField":1' if unknown else b"") + b"}"
        return Req("PATCH", seed, [("Content-Type", b.MERGE)], patch)
    if choice == 8:
        return Req("PATCH", seed, [("Content-Type", b.STRATEGIC)], b'{"data":{"k":"s"}}')
    if choice == 9:
        return Req("PATCH", seed, [("Content-Type", b.JSON_PATCH)], b'[{"op":"add","path":"/data/k","value":"j"}]')
    if choice == 10:
        body = b"apiVersion: v1\nkind: ConfigMap\ndata:\n  k: a\n" + (b"bogusField: x\n" if unknown else b"")
        return Req("PATCH", f"{COLL}/{NAME}?fieldManager=fz", [("Content-Type", b.APPLY_YAML)], body)
    if choice == 11:
        body = rng.choice([None, b"{}", b'{"kind":"DeleteOptions","apiVersion":"v1"}', b"null"])
        return Req("DELETE", seed, j if body else [], body)
    if choice == 12:
        return Req("DELETE", COLL + "?labelSelector=fz%3Dnone")
    if choice == 13:
        tr = b'{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}'
        return Req("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token", j, tr)
    return Req("GET", rng.choice(["/version", "/api", "/apis", "/api/v1", "/openapi/v2?timeout=2s"]))


# --------------------------------------------------------------------------- mutations

QUERY_PAIRS = [
    "dryRun=All", "dryRun=All;", "dryRun=%zz", "dry%52un=All", "DryRun=All", "dryrun=All", "dryRun=", "dryRun=all",
    "dryRun=All+", "dryRun=All%00", "fieldValidation=Ignore", "fieldValidation=Ignore;", "fieldValidation=%zz",
    "fieldValidation=%", "fieldValidation=Strict%zz", "field%56alidation=Ignore", "fieldValidation=Warn",
    "fieldValidation=", "fieldManager=fz", "fieldManager=%ff", "force=true", "pretty=1", "pretty", "limit=1",
    "resourceVersion=0", "resourceVersion=abc", "resourceVersionMatch=Exact", "labelSelector=%zz",
    "fieldSelector=metadata.name%3Ds0", "timeoutSeconds=1", "watch=1&timeoutSeconds=1", "allowWatchBookmarks=true",
    "x=1;y=2", "%", "=", "&&", "a[]=1", "propagationPolicy=Orphan", "gracePeriodSeconds=-1", "as=Table",
]  # fmt: skip
CTYPES = [
    b.JSON, b.YAML, b.PROTOBUF, b.CBOR, b.APPLY_YAML, b.APPLY_CBOR, b.MERGE, b.STRATEGIC, b.JSON_PATCH,
    "application/json; charset=utf-8", "APPLICATION/JSON", "application/json;x", "text/plain", "", "*/*",
    "application/yaml; charset=latin-1", "multipart/form-data; boundary=x", "application/json, application/yaml",
]  # fmt: skip
ACCEPTS = [
    "application/json", "application/yaml", b.PROTOBUF, b.CBOR, "*/*", "", "text/html",
    "application/json;as=Table;v=v1;g=meta.k8s.io", "application/json;stream=watch", "application/*;q=0.5",
    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
]  # fmt: skip
HEADERS = [
    ("X-HTTP-Method-Override", "GET"), ("X-HTTP-Method-Override", "DELETE"), ("Impersonate-User", "system:anonymous"),
    ("Impersonate-Group", "system:masters"), ("Content-Encoding", "gzip"), ("Accept-Encoding", "gzip"),
    ("Accept-Encoding", "zstd"), ("Expect", "100-continue"), ("X-Forwarded-For", "1.2.3.4"),
    ("Authorization", "Bearer not-a-token"), ("Connection", "Upgrade"), ("Upgrade", "websocket"),
    ("Transfer-Encoding", "identity"), ("Content-Type", b.JSON), ("Content-Type", b.YAML),
]  # fmt: skip


def _split(target: str) -> tuple[str, str]:
    path, _, query = target.partition("?")
    return path, query


def m_target_form(rng: random.Random, r: Req) -> Req:
    prefix = rng.choice(["http://localhost", "https://127.0.0.1", "HTTP://localhost", "http://127.0.0.1:1",
                         "http://u@localhost", "http://x", "x:", "/", "foo://"])  # fmt: skip
    return replace(r, target=prefix + r.target)


def m_pct(rng: random.Random, r: Req) -> Req:
    path, query = _split(r.target)
    if not path:
        return r
    i = rng.randrange(len(path))
    path = path[:i] + f"%{ord(path[i]):02{rng.choice('xX')}}" + path[i + 1 :]
    return replace(r, target=path + ("?" + query if query else ""))


def m_segments(rng: random.Random, r: Req) -> Req:
    path, query = _split(r.target)
    slashes = [i for i, c in enumerate(path) if c == "/"]
    if not slashes:
        return r
    i = rng.choice(slashes)
    piece = rng.choice(["/./", "/x/../", "//", "/%2e/", "/%2E%2E/", "/.%2e/", "/;/", "\\"])
    path = path[:i] + piece + path[i + 1 :]
    return replace(r, target=path + ("?" + query if query else ""))


def m_tail(rng: random.Random, r: Req) -> Req:
    return replace(r, target=r.target + rng.choice(["?", "#x", "/", ";x", "%", "?#", "&", "%00", " "]))


def m_query(rng: random.Random, r: Req) -> Req:
    path, query = _split(r.target)
    pairs = [p for p in query.split("&") if p] + [rng.choice(QUERY_PAIRS) for _ in range(rng.randint(1, 3))]
    rng.shuffle(pairs)
    return replace(r, target=path + "?" + rng.choice(["&", "&", ";", "&&"]).join(pairs))


def m_method(rng: random.Random, r: Req) -> Req:
    choice = rng.randrange(4)
    if choice == 0:
        return replace(r, method=r.method.lower())
    if choice == 1:
        return replace(r, method="".join(c.lower() if rng.random() < 0.5 else c for c in r.method))
    if choice == 2:
        return replace(r, method=rng.choice(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "PROPFIND"]))
    override = rng.choice(["GET", "DELETE", "POST", "PATCH"])
    return replace(r, headers=[*r.headers, ("X-HTTP-Method-Override", override)])


def m_ctype(rng: random.Random, r: Req) -> Req:
    headers = [(k, v) for k, v in r.headers if k.lower() != "content-type"]
    ct = rng.choice(CTYPES)
    return replace(r, headers=[*headers, ("Content-Type", ct)] if ct else headers)


def m_accept(rng: random.Random, r: Req) -> Req:
    return replace(r, headers=[*r.headers, ("Accept", rng.choice(ACCEPTS))])


def m_header(rng: random.Random, r: Req) -> Req:
    return replace(r, headers=[*r.headers, rng.choice(HEADERS)])


def m_body(rng: random.Random, r: Req) -> Req:
    body = r.body if r.body is not None else b"{}"
    choice = rng.randrange(11)
    if choice == 0 and body:
        i = rng.randrange(len(body))
        body = body[:i] + bytes([body[i] ^ (1 << rng.randrange(8))]) + body[i + 1 :]
    elif choice == 1:
        body = body[: rng.randrange(len(body) + 1)]
    elif choice == 2 and body.startswith(b"{"):
        body = b'{"bogusField":1,' + body[1:]
    elif choice == 3 and body.startswith(b"{"):
        body = b'{"kind":"ConfigMap","kind":"Secret",' + body[1:]
    elif choice == 4:
        body = body.replace(b'"v"', b'"\xff\xfe"').replace(b"k: v", b"k: \xc3\x28")
    elif choice == 5:
        body = body.replace(b'"k":"v"', b'"k":1' + b"0" * 400)
    elif choice == 6:
        depth = rng.choice([10, 100, 1000])
        body = body.replace(b'"k":"v"', b'"k":' + b"[" * depth + b"]" * depth)
    elif choice == 7:
        body = b.yaml_alias_bomb(rng.randint(1, 4), rng.randint(1, 4))
    elif choice == 8:
        body = rng.choice([b"", b"null", b"[]", b"\x00", b"k8s\x00", b"\xd9\xd9\xf7", b"---\n---\n", b"{}" * 3])
    elif choice == 9:
        body = base64.b64encode(body)
    else:
        return replace(r, body=body, chunked=True)
    return replace(r, body=body)


UPGRADES = ["websocket", "WebSocket", "SPDY/3.1", "h2c", "x", "websocket, h2c", "tls/1.2"]
UPGRADE_CONNECTIONS = ["Upgrade", "upgrade", "keep-alive, Upgrade", "Upgrade, HTTP2-Settings", "upgraded", "close"]


def m_upgrade(rng: random.Random, r: Req) -> Req:
    """Ask for an upgrade (the apiserver answers anything but its connect subresources and
    WebSocket watches as an ordinary request, so every policy still applies)."""
    headers = [(k, v) for k, v in r.headers if k.lower() not in ("connection", "upgrade")]
    headers.append(("Connection", rng.choice(UPGRADE_CONNECTIONS)))
    if rng.random() < 0.9:
        headers.append(("Upgrade", rng.choice(UPGRADES)))
    if rng.random() < 0.3:
        headers += [("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]
    return replace(r, headers=headers)


MUTATORS: list[Callable[[random.Random, Req], Req]] = [
    m_target_form, m_pct, m_segments, m_tail, m_query, m_query, m_method, m_ctype, m_accept, m_header, m_body, m_body,
    m_upgrade,
]  # fmt: skip


def generate(seed: int, index: int, chain: str = "") -> Req:
    """Request ``index`` of the run with ``seed``: a template plus 0-3 mutations, from these two
    numbers alone (and the chain: ``identity`` has its own generator)."""
    if chain == "identity":
        return generate_identity(seed, index)
    rng = random.Random(f"{seed}:{index}")
    req = _templates(rng)
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        req = rng.choice(MUTATORS)(rng, req)
    return req


# --------------------------------------------------------------------------- identity headers

SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SSR_BODY = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
WS_PREFIX = "base64url.bearer.authorization.k8s.io."
#: Go's unicode.IsSpace beyond ASCII, and what Python or a reader might take for white space.
GO_SPACES = "\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
NOT_GO_SPACES = "\x1c\x1f\u180e\u200b\ufeff\u2060"
#: Bytes that are not UTF-8 (surrogateescape), which Go reads as RuneError, never white space.
NOT_UTF8 = ("\udcff", "\udcc2", "\udce3\udc80", "\udcc0\udca0")
#: Spellings of "websocket" and "upgrade": Go's EqualFold folds U+017F to s and U+212A to k, not
#: the Turkish I's or look-alikes from other scripts.
WEBSOCKETS = [
    "websocket", "WebSocket", "WEBSOCKET", "web\u017focket", "WEB\u017fOCKET", "websoc\u212aet", "we\u0432socket",
    "web\u0455ocket", " websocket", "websocket\u3000", "\u2003websocket", "websocket,x", "h2c", "x", "",
]  # fmt: skip
CONNECTIONS = [
    "Upgrade", "upgrade", "UPGRADE", "keep-alive, Upgrade", "Upgrade, keep-alive", "\u3000Upgrade", "upgraded",
    "keep-alive upgrade", "x-upgrade-y", "close", "keep-alive", "Upgr\u0430de", "UP\u0130GRADE", "",
]  # fmt: skip
BAD_TOKEN = "not-a-token"


def _space(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.5:
        return rng.choice(GO_SPACES)
    if r < 0.7:
        return rng.choice(" \t")
    if r < 0.85:
        return rng.choice(NOT_GO_SPACES)
    return rng.choice(NOT_UTF8)


def _pad(rng: random.Random, text: str) -> str:
    """``text`` with white space (Go's, ASCII, or not Go's) before or after it, or neither."""
    choice = rng.randrange(5)
    if choice == 0:
        return _space(rng) + text
    if choice == 1:
        return text + _space(rng)
    if choice == 2:
        return _space(rng) + text + _space(rng)
    return text


def _scheme(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return "Bearer"
    return rng.choice(["bearer", "BEARER", "bEaReR", "Basic", "Bearer:", "B\u0435arer"])


def h_authorization(rng: random.Random) -> list[tuple[str, str]]:
    """One to three Authorization lines: Go reads only the first, trimmed of Unicode white space,
    split on single spaces."""
    lines = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        token = rng.choice([TOKEN, TOKEN, TOKEN, TOKEN, BAD_TOKEN, ""])
        sep = " " if rng.random() < 0.7 else rng.choice(["  ", "\t", rng.choice(GO_SPACES)])
        name = rng.choice(["Authorization", "authorization", "AUTHORIZATION"])
        lines.append((name, _pad(rng, _scheme(rng) + sep + token)))
    return lines


def _protocol_entry(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.55:
        return _pad(rng, WS_PREFIX + WSTOKEN)
    if r < 0.65:
        return WS_PREFIX + rng.choice([WSTOKEN + "=", WSTOKEN + "==", "+" + WSTOKEN, "", "bm90LWEtdG9rZW4", "!"])
    return _pad(rng, rng.choice(["v4.channel.k8s.io", "v5.channel.k8s.io", "x", "", "base64.binary.k8s.io"]))


def h_websocket(rng: random.Random) -> list[tuple[str, str]]:
    """An upgrade request (Upgrade, Connection in their spellings) whose token, if any, is in
    Sec-WebSocket-Protocol, over one or two header lines."""
    lines = []
    if rng.random() < 0.9:
        r = rng.random()
        upgrade = "websocket" if r < 0.3 else rng.choice(WEBSOCKETS) if r < 0.8 else _pad(rng, "websocket")
        lines.append(("Upgrade", upgrade))
    for _ in range(rng.choice([0, 1, 1, 1, 1, 2])):
        lines.append(("Connection", "Upgrade" if rng.random() < 0.4 else rng.choice(CONNECTIONS)))
    for _ in range(rng.choice([1, 1, 2])):
        entries = [_protocol_entry(rng) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:  # as clients send it: a channel protocol beside the token
            entries.insert(rng.randrange(len(entries) + 1), "v4.channel.k8s.io")
        lines.append(("Sec-WebSocket-Protocol", ",".join(entries)))
    if rng.random() < 0.5:
        lines += [("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]
    return lines


def generate_identity(seed: int, index: int) -> Req:
    """An identity request: a SelfSubjectReview (the judge of who the caller is), a create with or
    without an unknown field, or a read; the token in Authorization, the WebSocket protocol, or both."""
    rng = random.Random(f"{seed}:identity:{index}")
    choice = rng.randrange(10)
    j = [("Content-Type", b.JSON)]
    if choice < 5:
        req = Req("POST", SSR_PATH, j, SSR_BODY, utf8=True)
    elif choice < 8:
        req = Req("POST", COLL, j, json.dumps(_obj(rng, choice == 7)).encode(), utf8=True)
    else:
        req = Req("GET", f"{COLL}/{rng.choice(SEEDS)}", utf8=True)
    where = rng.randrange(4)
    headers = []
    if where in (0, 2):
        headers += h_authorization(rng)
    if where in (1, 2, 3):
        headers += h_websocket(rng)
    if where == 3:  # the protocol on a request that is not an upgrade: it means nothing to Go
        headers = [(k, v) for k, v in headers if k not in ("Upgrade", "Connection")]
    if rng.random() < 0.2:
        headers.append(("Connection", rng.choice(CONNECTIONS)))
    rng.shuffle(headers)
    return replace(req, headers=req.headers + headers)


# --------------------------------------------------------------------------- checking


@dataclass
class Side:
    """A kproxy chain under fuzz and the namespaces it works in."""

    target: str
    proxy: RunningProxy
    cp: ControlPlaneInfo
    via_ns: str
    direct_ns: str
    #: ``identity``: each namespace's service-account token, which its requests carry.
    via_token: str = ""
    direct_token: str = ""

    def resync(self) -> None:
        """Put the seed objects back as they started, on both sides: after a request that one side
        served and the other refused, the two namespaces would differ for every later request."""
        for attempt in range(3):
            try:
                for ns in (self.via_ns, self.direct_ns):
                    for seed in SEEDS:
                        body = json.dumps(b.cm(seed)).encode()
                        if self.cp.request("PUT", f"/api/v1/namespaces/{ns}/configmaps/{seed}", body=body)[0] == 404:
                            self.cp.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=body)
                return
            except (OSError, http.client.HTTPException):
                if attempt == 2:
                    raise
                eventually(self.cp.readyz, 120, "the apiserver to come back")

    def etcd_keys(self) -> dict[str, int]:
        """Keys under the kproxy-side namespace (any resource) with their mod revisions."""
        out: dict[str, int] = {}
        for resource in ("configmaps", "secrets", "serviceaccounts"):
            prefix = f"/registry/{resource}/{self.via_ns}/".encode()
            end = prefix[:-1] + bytes([prefix[-1] + 1])
            span = {"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode()}
            reply = self.cp.etcd("kv/range", {**span, "keys_only": True})
            for kv in reply.get("kvs", []):
                out[base64.b64decode(kv["key"]).decode()] = int(kv["mod_revision"])
        return out


@dataclass
class Failure:
    seed: int
    index: int
    target: str
    what: str
    raw: bytes
    via: Answer
    direct: Answer

    def line(self) -> str:
        return (
            f"[{self.target} seed={self.seed} index={self.index}] {self.what}: kproxy {self.via.short()[:200]} | "
            f"apiserver {self.direct.short()[:200]} | raw={self.raw[:3000]!r}"
        )


def _warned(a: Answer) -> bool:
    return any("unknown field" in w or "duplicate field" in w for w in a.headers_all("Warning"))


def _text_400(a: Answer) -> bool:
    return a.status == 400 and not a.is_status()


def _request_line(raw: bytes) -> bytes:
    return raw.split(b"\r\n", 1)[0]


def _target(raw: bytes) -> bytes:
    return _request_line(raw).split(b" ")[1]


#: Differences at the HTTP edge that are known and reported, each with why (never a policy failure:
#: only answers where kproxy refuses what Go serves, or serves what Go refuses, are excused here).
#: A class no longer seen in a full CI run fails the test, so the entry goes when its fix lands.
KNOWN: dict[str, tuple[str, Callable[[bytes, Answer, Answer], bool]]] = {}
#: The chains each KNOWN class must show in, in a full CI run (the others lack the filter it needs,
#: or the class is too rare for 1,000 requests); by default the chains of mutated requests (the
#: identity chain has its own generator, which mutates no target, method or body).
KNOWN_IN: dict[str, tuple[str, ...]] = {}
MUTATED_CHAINS = ("transparent", "policy")


def _guarded(raw: bytes, via: Answer) -> bool:
    """`credentials: proxy` refuses a Host that is not a loopback name, as kubectl proxy does (its
    403 text): Go takes the host of an absolute-form target as the request's Host."""
    m = re.match(rb"(?i)[a-z][a-z0-9+.-]*://(?:[^@/]*@)?(\[[^]]*\]|[^:/?#]*)", _target(raw))
    return via.status == 403 and via.body == b"Forbidden\n" and m is not None and m[1] not in LOOPBACK


LOOPBACK = (b"localhost", b"127.0.0.1", b"[::1]")

#: Problems that are never excused by KNOWN.
SECURITY = ("kproxy exited", "traceback", "persisted", "token", "Strict", "identity")


def explain(problems: list[str], raw: bytes, via: Answer, direct: Answer) -> str | None:
    """The KNOWN class that explains every problem of this request, if any does."""
    if any(word in p for p in problems for word in SECURITY):
        return None
    if _guarded(raw, via):
        return "proxy-mode-host"
    return next((name for name, (_, known) in KNOWN.items() if known(raw, via, direct)), None)


def check(side: Side, raw: bytes, via: Answer, direct: Answer, log: str, keys_changed: list[str]) -> list[str]:
    problems = []
    if side.proxy.proc.poll() is not None:
        problems.append("kproxy exited")
    if "Traceback" in log:
        problems.append("traceback in kproxy's log: " + log[log.index("Traceback") :][:600].replace("\n", " | "))
    if via.status == TIMEOUT and direct.status != TIMEOUT:
        problems.append("kproxy gave no answer in time")
    if via.status >= 500 and direct.status < 500:
        problems.append("kproxy 5xx where the apiserver answered otherwise")
    if via.status >= 400 and direct.is_status() and not via.is_status():
        problems.append("kproxy's error is not a Status")
    if side.target == "transparent" and via.status // 100 != direct.status // 100:
        problems.append("status class differs")
    if side.target == "identity":
        problems += _identity_problems(side, raw, via, direct)
    if side.target in ("policy", "identity"):
        if keys_changed:
            problems.append(f"persisted through the policy: {keys_changed}")
        doc = via.json()
        if isinstance(doc, dict) and doc.get("kind") == "TokenRequest" and doc["status"].get("token"):
            problems.append("a service-account token was handed out")
        if 200 <= direct.status < 300 and _warned(direct) and 200 <= via.status < 300:
            problems.append("a write the apiserver warned about passed Strict validation")
    return problems


def _reviewed_user(a: Answer) -> str | None:
    doc = a.json()
    if a.status != 201 or not isinstance(doc, dict) or doc.get("kind") != "SelfSubjectReview":
        return None
    return str((doc.get("status") or {}).get("userInfo", {}).get("username"))


def _identity_problems(side: Side, raw: bytes, via: Answer, direct: Answer) -> list[str]:
    """Whom the apiserver saw (its SelfSubjectReview, sent straight to it) against whom kproxy saw
    (its rule refusing the service account's reviews fired, or not), and, where kproxy let the
    review through, whom the apiserver saw through kproxy."""
    if SSR_PATH.encode() not in _request_line(raw) or via.status == 429:
        return []  # not a review; or kproxy bounded its token reviews (nothing reached the apiserver)
    sa = f"system:serviceaccount:{{}}:{SA}"
    seen_direct = _reviewed_user(direct)
    apiserver_saw_sa = seen_direct == sa.format(side.direct_ns)
    kproxy_saw_sa = via.status == 403 and b"fz-seen" in via.body
    if kproxy_saw_sa != apiserver_saw_sa:
        who = "the service account" if kproxy_saw_sa else "another caller"
        return [f"identity: kproxy took the caller for {who}; the apiserver saw {seen_direct or direct.status}"]
    if kproxy_saw_sa:
        return []
    seen_via = _reviewed_user(via)
    if seen_via is not None and seen_direct is not None:
        seen_via = seen_via.replace(side.via_ns, side.direct_ns)
    if (seen_via, via.status) != (seen_direct, direct.status):
        saw = f"through kproxy the apiserver saw {seen_via or via.status}"
        return [f"identity: {saw}, directly {seen_direct or direct.status}"]
    return []


def _apiserver_down(side: Side, via: Answer, direct: Answer) -> bool:
    """Whether the shared apiserver was unreachable (another test restarting it), not kproxy's doing."""
    if direct.error.startswith("connect:") or b"upstream kube-apiserver is unavailable" in via.body:
        return True
    return direct.status in (CLOSED, TIMEOUT) and not side.cp.readyz()


def service_account_tokens(cp: ControlPlaneInfo, via_ns: str, direct_ns: str) -> tuple[str, str]:
    """For ``identity``: the service account of each namespace may do anything with ConfigMaps
    there; its token (a TokenRequest)."""
    tokens = []
    for ns in (via_ns, direct_ns):
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
        role = {"metadata": {"name": SA}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]}
        binding = {
            "metadata": {"name": SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": ns}],
        }
        for path, body in ((f"{rbac}/roles", role), (f"{rbac}/rolebindings", binding)):
            code, resp = cp.request("POST", path, body=json.dumps(body).encode())
            assert code in (201, 409), resp
        tr = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}}
        code, resp = cp.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{SA}/token",
                                body=json.dumps(tr).encode())  # fmt: skip
        assert code == 201, resp
        token = str(json.loads(resp)["status"]["token"])
        path = f"/api/v1/namespaces/{ns}/configmaps"
        eventually(lambda: cp.request("GET", path, token=token)[0] == 200, 30, "the service account's binding")  # noqa: B023
        tokens.append(token)
    return tokens[0], tokens[1]


def seed_namespaces(cp: ControlPlaneInfo, via_ns: str, direct_ns: str) -> None:
    for ns in (via_ns, direct_ns):
        for path, body in (
            ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            (f"/api/v1/namespaces/{ns}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                                                          "metadata": {"name": SA}}),
            *((f"/api/v1/namespaces/{ns}/configmaps", b.cm(s)) for s in SEEDS),
        ):  # fmt: skip
            code, resp = cp.request("POST", path, body=json.dumps(body).encode())
            assert code in (201, 409), resp


@dataclass
class Result:
    failures: list[Failure] = field(default_factory=list)
    #: (kproxy, apiserver) status pairs, how many of each.
    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)
    #: KNOWN classes seen, how often, with a first example.
    known: Counter[str] = field(default_factory=Counter)
    examples: dict[str, Failure] = field(default_factory=dict)
    #: Requests the proxy-mode Host check refused (policy, not a difference).
    guarded: int = 0
    #: Requests sent while the apiserver was unreachable (not compared).
    skipped: int = 0

    def summary(self) -> str:
        known = ", ".join(f"{k} x{n}" for k, n in self.known.most_common()) or "none"
        return (
            f"{len(self.failures)} failures; known differences: {known}; refused by the proxy-mode Host check: "
            f"{self.guarded}; skipped while the apiserver was down: {self.skipped}; "
            f"statuses {dict(self.pairs.most_common(10))}"
        )


def run(side: Side, seed: int, count: int, start: int = 0, report: Callable[[str], None] = print) -> Result:
    """Send ``count`` generated requests to both sides and check each (failures are reported as they come)."""
    via_ep = Endpoint.from_url(side.proxy.url)
    # The identity chain's callers are their tokens alone: no client certificate to the apiserver.
    direct_tls = side.cp.ssl_context(client_cert=side.target != "identity")
    direct_ep = Endpoint("127.0.0.1", side.cp.apiserver_port, direct_tls)
    result = Result()
    keys = side.etcd_keys() if side.target in ("policy", "identity") else {}
    for index in range(start, start + count):
        req = generate(seed, index, side.target)
        name = f"fz{index}"
        via_raw = req.render(side.via_ns, name, side.via_token)
        direct_raw = req.render(side.direct_ns, name, side.direct_token)
        log_from = side.proxy.log.stat().st_size
        via = exchange(via_ep, via_raw, timeout=5)
        direct = exchange(direct_ep, direct_raw, timeout=5)
        with side.proxy.log.open("rb") as f:
            f.seek(log_from)
            log = f.read().decode(errors="replace")
        changed: list[str] = []
        if side.target in ("policy", "identity"):
            now = side.etcd_keys()
            changed = sorted(k for k in now.keys() | keys.keys() if now.get(k) != keys.get(k))
            keys = now
        if _apiserver_down(side, via, direct) and not changed:
            # The shared apiserver is restarting (another test's outage): this request proves nothing.
            result.skipped += 1
            eventually(side.cp.readyz, 120, "the apiserver to come back")
            continue
        result.pairs[via.status, direct.status] += 1
        problems = check(side, via_raw, via, direct, log, changed)
        known = explain(problems, via_raw, via, direct) if problems else None
        if known == "proxy-mode-host":
            result.guarded += 1
        elif known:
            result.known[known] += 1
            result.examples.setdefault(known, Failure(seed, index, side.target, known, via_raw, via, direct))
        for what in problems if not known else []:
            failure = Failure(seed, index, side.target, what, via_raw, via, direct)
            result.failures.append(failure)
            report(failure.line())
        if side.proxy.proc.poll() is not None:
            break
        if side.target == "transparent" and via.status // 100 != direct.status // 100:
            side.resync()
    return result


def twin_names() -> tuple[str, str]:
    tag = secrets.token_hex(3)
    return f"fzk-{tag}", f"fzd-{tag}"


def start_side(target: str, cp: ControlPlaneInfo, tmp: Path, starter: Callable[..., RunningProxy]) -> Side:
    """Twin namespaces (and for ``identity`` their service accounts' tokens) and a kproxy with
    ``target``'s chain, started by ``starter(tmp, cp, credentials=..., extra=...)``."""
    via_ns, direct_ns = twin_names()
    seed_namespaces(cp, via_ns, direct_ns)
    tokens = service_account_tokens(cp, via_ns, direct_ns) if target == "identity" else ("", "")
    rp = starter(tmp, cp, credentials=CREDENTIALS.get(target, "proxy"), extra={"filters": CHAINS[target]})
    return Side(target, rp, cp, via_ns, direct_ns, *tokens)


def main(argv: list[str] | None = None) -> int:
    from kproxy.localcluster.envtest import DIR_ENV, load
    from kproxy.testing.proxyproc import start_proxy

    parser = argparse.ArgumentParser(prog="python -m tests.adversarial.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=int, default=0, help="first index (with --count 1: replay one request)")
    parser.add_argument("--target", choices=[*CHAINS, "all"], default="all")
    parser.add_argument("--envtest-dir", default=None, help=f"a running control plane (default: ${DIR_ENV})")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the kproxy it started on the way out
    import os
    import tempfile

    directory = args.envtest_dir or os.environ.get(DIR_ENV)
    if not directory:
        parser.error(f"a running control plane is needed: --envtest-dir or ${DIR_ENV}")
    cp = load(Path(directory))
    total = 0
    for target in CHAINS if args.target == "all" else [args.target]:
        with tempfile.TemporaryDirectory() as tmp:
            side = start_side(target, cp, Path(tmp), lambda t, c, **kw: start_proxy(t, c.admin_kubeconfig, **kw))
            rp = side.proxy
            try:
                began = time.monotonic()
                result = run(side, args.seed, args.count, args.start)
                took = time.monotonic() - began
            finally:
                rp.stop()
        print(f"{target}: {args.count} requests in {took:.1f}s, {result.summary()}")
        for name, example in result.examples.items():
            print(f"  known {name}: {KNOWN[name][0]}; e.g. {example.line()[:600]}")
        total += len(result.failures)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
