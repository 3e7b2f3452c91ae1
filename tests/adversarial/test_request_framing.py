"""Request smuggling: a caller's bytes whose request boundaries two HTTP parsers could read
differently, sent through kproxy in ``credentials: impersonate`` (its upstream connections carry
kproxy's own, privileged credentials, so a request the apiserver read out of another's body would
run as kproxy).

Each case is one connection from a caller with no rights (certificate CN ``adv-eve``): a
SelfSubjectReview framed ambiguously (Content-Length against Transfer-Encoding, spellings of
``chunked``, folds, bare line ends, HTTP/1.0, chunk syntax), with a hidden request in what one
reading takes for its body: a ConfigMap create and another SelfSubjectReview. kproxy reads the
bytes as Go's server does (``kproxy.server.h1request``) and frames what it forwards itself, so the
verdict is at the apiserver: nothing was persisted, and every review the caller got back names
``adv-eve``, never kproxy."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
from pathlib import Path

from kproxy.localcluster import certs
from kproxy.testing.proxyproc import RunningProxy

from .bodies import cm_json
from .conftest import Twins, caller_context
from .inventory_support import SSR

CALLER = "adv-eve"
SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
HEAD = f"POST {SSR_PATH} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Type: application/json\r\n"


def _hidden(ns: str, name: str) -> bytes:
    """The smuggled requests: a create, then a review (whose answer names whoever ran it)."""
    body = cm_json(name)
    create = (
        f"POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    review = (HEAD + f"Content-Length: {len(SSR)}\r\n\r\n").encode() + SSR
    return create + review


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _cases(ns: str) -> dict[str, bytes]:
    head = HEAD.encode()
    out: dict[str, bytes] = {}

    def hidden(case: str) -> bytes:
        return _hidden(ns, f"smug-{case}")

    def add(case: str, build: object) -> None:
        out[case] = build(hidden(case))  # type: ignore[operator]

    # Content-Length says the hidden requests are body; chunked ends the body first (and the reverse).
    add(
        "cl-te",
        lambda h: (
            head
            + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % (len(_chunk(SSR)) + 5 + len(h))
            + _chunk(SSR)
            + b"0\r\n\r\n"
            + h
        ),
    )
    add(
        "te-cl",
        lambda h: (
            head
            + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(SSR)
            + _chunk(SSR + h)
            + b"0\r\n\r\n"
        ),
    )
    spellings = {
        "tab": b"chunked\t",
        "space": b" chunked",
        "upper": b"Chunked",
        "then-identity": b"chunked, identity",
        "identity-then": b"identity, chunked",
        "prefixed": b"xchunked",
        "plain": b"chunked",
    }
    for tag, spelling in spellings.items():
        add(
            f"te-{tag}",
            lambda h, s=spelling: (
                head
                + b"Content-Length: %d\r\nTransfer-Encoding: %s\r\n\r\n" % (len(_chunk(SSR)) + 5 + len(h), s)
                + _chunk(SSR)
                + b"0\r\n\r\n"
                + h
            ),
        )
    add(
        "te-folded",
        lambda h: (
            head
            + b"Content-Length: %d\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" % (len(_chunk(SSR)) + 5 + len(h))
            + _chunk(SSR)
            + b"0\r\n\r\n"
            + h
        ),
    )
    add(
        "cl-folded",
        lambda h: (
            head
            + b"X-A: a\r\n Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(SSR) + len(h), len(SSR))
            + SSR
            + h
        ),
    )
    add(
        "te-http10",
        lambda h: (
            head.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Connection: keep-alive\r\n"
            b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(SSR) + SSR + h
        ),
    )
    add(
        "two-cl",
        lambda h: head + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(SSR), len(SSR) + len(h)) + SSR + h,
    )
    add("lf-head", lambda h: head.replace(b"\r\n", b"\n") + b"Content-Length: %d\n\n" % len(SSR) + SSR + h)
    add("cr-head", lambda h: head + b"Content-Length: %d\r\rTransfer-Encoding: chunked\r\n\r\n" % len(SSR) + SSR + h)
    add(
        "chunk-bare-lf",
        lambda h: head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\n" % len(SSR) + SSR + b"\r\n0\r\n\r\n" + h,
    )
    add(
        "chunk-ext-lf",
        lambda h: head + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x;\n\r\n" % len(SSR) + SSR + b"\r\n0\r\n\r\n" + h,
    )
    add(
        "chunk-size-overflow",
        lambda h: (
            head
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"1"
            + b"0" * 16
            + b"%x\r\n" % len(SSR)
            + SSR
            + b"\r\n0\r\n\r\n"
            + h
        ),
    )
    add("trailer-request", lambda h: head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(SSR) + b"0\r\n" + h)
    add("get-with-body", lambda h: HEAD.replace("POST", "GET", 1).encode() + b"Content-Length: %d\r\n\r\n" % len(h) + h)
    return out  # fmt: skip


def _context(rp: RunningProxy, ca: certs.CertKey, tmp: Path) -> ssl.SSLContext:
    return caller_context(rp, ca, tmp, CALLER, [])


def _converse(rp: RunningProxy, ctx: ssl.SSLContext, raw: bytes) -> bytes:
    """Everything kproxy writes back on one connection carrying ``raw``, until it closes or has
    been quiet for a second after its first answer (a kept-alive connection waits for more)."""
    host, port = rp.url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as plain:
        sock = ctx.wrap_socket(plain, server_hostname=host)
        sock.sendall(raw)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                got += chunk
                sock.settimeout(1.0)
                if got.count(b"HTTP/1.1 ") >= 8:
                    break
        return got


def test_no_smuggled_request_runs_as_kproxy(
    imp: RunningProxy, caller_ca: certs.CertKey, twins: Twins, tmp_path: Path
) -> None:
    ctx = _context(imp, caller_ca, tmp_path)
    seen: dict[str, list[str]] = {}
    for case, raw in _cases(twins.via).items():
        answers = _converse(imp, ctx, raw)
        assert imp.proc.poll() is None, f"kproxy exited on {case}"
        users = re.findall(rb'"username":"([^"]*)"', answers)
        seen[case] = [u.decode() for u in users]
        # Who the apiserver thought the caller was, in every review that came back.
        assert set(seen[case]) <= {CALLER}, (case, seen[case], raw)
        persisted = twins.get(f"/api/v1/namespaces/{twins.via}/configmaps/smug-{case}")
        assert persisted is None, (case, answers[:600], raw)
    # The first review of every case that Go's server takes was served as the caller.
    assert all(seen[c][:1] == [CALLER] for c in ("cl-te", "te-plain", "te-tab", "te-upper") if c in seen), seen
    assert "Traceback" not in imp.log_text()


def test_the_hidden_requests_are_what_go_reads_them_as(twins: Twins) -> None:
    """The cases are real: each hidden create is well-formed, and sent alone by an admin it
    would persist (so a smuggled one would have too)."""
    hidden = _hidden(twins.via, "smug-probe")
    create = hidden[: hidden.index(b"POST " + SSR_PATH.encode())]
    body = create.split(b"\r\n\r\n", 1)[1]
    code, resp = twins.cp.request("POST", f"/api/v1/namespaces/{twins.via}/configmaps", body=body)
    assert code == 201, resp
    assert json.loads(resp)["metadata"]["name"] == "smug-probe"
