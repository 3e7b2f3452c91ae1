"""Red team (round two): a client with no valid credentials fills the process-wide body budget.

With a Strict (or dry-run) rule on a namespace, kproxy reads every write's body into that namespace
before the apiserver sees the request, also for callers without valid credentials, whom the
apiserver would refuse (401 for a bogus token, 403 without one) without reading a byte. Each body
takes its declared ``Content-Length`` from the body budget (kproxy/core/bodybudget.py: 64 MiB for
all callers, 16 MiB per caller) at once; a caller kproxy cannot name (a random bearer token in
``forward``; every caller in ``proxy``) is charged by its client address. So a handful of
addresses (any few pods; here loopback sources), each opening six connections that declare a
2.8 MB body and never send it, hold the whole budget until the 60 s read deadline, and renew it
at will. Every other caller's checked write then waits a second for bytes and is answered 429.

The verdict: a legitimate service account's small Strict creates, which the apiserver persists
under the same stalled connections (it never reads an unauthenticated body), must be persisted
through kproxy too (a GET as admin finds them)."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .accounts import account_with_role, create
from .conftest import start_capped

#: Loopback source addresses of the stalling client and connections per address: six bodies of
#: 2,796,202 bytes (under the apiserver's 3 MiB) fill a caller's 16 MiB share to 4 bytes, and four
#: addresses fill the 64 MiB total to 16 bytes (a fifth address only makes sure).
SOURCES = [f"127.0.0.{n}" for n in range(60, 65)]
PER_SOURCE = 6
DECLARED = (16 << 20) // PER_SOURCE
VICTIM_WRITES = 6


@dataclass
class Setup:
    cp: ControlPlaneInfo
    ns: str
    token: str
    proxy: RunningProxy
    mode: str


@pytest.fixture(scope="module", params=["forward", "proxy"])
def setup(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    cp = control_plane
    ns = f"redteam2-b-{secrets.token_hex(3)}"
    create(cp, "/api/v1/namespaces", {"metadata": {"name": ns}})
    role = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list"]}
    token = account_with_role(cp, ns, "victim", [role])
    strict = [{"name": "validation", "rules": [{"name": "strict", "level": "Strict", "match": {"namespaces": [ns]}}]}]
    rp = start_capped(
        tmp_path_factory.mktemp("redteam2-budget"), cp, credentials=request.param, tls=True, extra={"filters": strict}
    )
    yield Setup(cp, ns, token, rp, request.param)
    rp.stop(signal.SIGKILL)
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")


def _ctx(rp: RunningProxy) -> ssl.SSLContext:
    assert rp.ca_file is not None
    return ssl.create_default_context(cafile=str(rp.ca_file))


def _port(rp: RunningProxy) -> int:
    return int(rp.url.rsplit(":", 1)[1])


async def _stall(port: int, ctx: ssl.SSLContext, source: str, ns: str, let_in: asyncio.Queue[str]) -> None:
    """A create with no valid credentials (a random bearer token, which the apiserver would answer
    401 without reading the body) that declares its body, is told to go on, and sends none of it."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1", local_addr=(source, 0)
    )
    head = (
        f"POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {secrets.token_urlsafe(24)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {DECLARED}\r\nExpect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    try:
        line = await reader.readline()
        await let_in.put(line.decode("latin-1").strip())
        await reader.read()  # held until kproxy gives up on the body
    except OSError:
        await let_in.put("error")
    finally:
        writer.close()


async def _victim_write(port: int, ctx: ssl.SSLContext, token: str, ns: str, name: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
    head = (
        f"POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body.encode())
    try:
        async with asyncio.timeout(30):
            status = await reader.readline()
            await reader.read()
        return int(status.split()[1])
    finally:
        writer.close()


async def test_stalled_bodies_without_credentials_get_no_legitimate_write_refused(setup: Setup) -> None:
    ctx, port = _ctx(setup.proxy), _port(setup.proxy)
    # kproxy serves the victim before the attack (its token reviewed and cached).
    assert await _victim_write(port, ctx, setup.token, setup.ns, "warm") == 201
    let_in: asyncio.Queue[str] = asyncio.Queue()
    stalls = [
        asyncio.ensure_future(_stall(port, ctx, source, setup.ns, let_in))
        for source in SOURCES
        for _ in range(PER_SOURCE)
    ]
    try:
        answers = [await asyncio.wait_for(let_in.get(), 20) for _ in stalls]
        continued = sum(a == "HTTP/1.1 100 Continue" for a in answers)
        if setup.mode == "forward":
            # Each stalled request is answered the apiserver's 401 for its rejected token before
            # any byte of its body is read, or (a caller kproxy cannot show allowed the write is
            # left to the apiserver, which checks it) streamed through as it comes: either way
            # kproxy holds none of it.
            assert set(answers) <= {"HTTP/1.1 401 Unauthorized", "HTTP/1.1 100 Continue"}, answers
        else:
            # Every caller is kproxy itself: each body is let in, as the apiserver lets in the
            # bodies of an authenticated user, and their declared lengths exceed the budget.
            assert continued * DECLARED > (64 << 20) - 100, answers
        t0 = time.monotonic()
        statuses = [await _victim_write(port, ctx, setup.token, setup.ns, f"victim-{i}") for i in range(VICTIM_WRITES)]
        took = time.monotonic() - t0
    finally:
        for s in stalls:
            s.cancel()
        await asyncio.gather(*stalls, return_exceptions=True)
    persisted = [
        i
        for i in range(VICTIM_WRITES)
        if setup.cp.request("GET", f"/api/v1/namespaces/{setup.ns}/configmaps/victim-{i}")[0] == 200
    ]
    assert statuses == [201] * VICTIM_WRITES and len(persisted) == VICTIM_WRITES, (
        f"while {continued} bodies without credentials stalled, the victim's creates were answered "
        f"{statuses} in {took:.1f} s; persisted: {persisted}"
    )
