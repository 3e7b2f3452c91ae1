"""Red team: a client with no credentials gets legitimate callers refused (TokenReview bounds).

In ``credentials: forward`` kproxy sends a TokenReview for a token it has not seen (or whose
review is older than its cache's lifetime) before a policy rule can match its caller. Reviews are
bounded (kproxy/identity/reviewlimit.py): 4 in flight per client address, 32 in total; past either
bound the request is answered 429. Spraying random bearer tokens needs no credentials at all,
and 16 source addresses with 4 connections each keep the total bound full: a legitimate service
account's write with its fresh token (a new pod's projected token, or any token after the
cache's 10 s) is then answered 429 where the apiserver, under the same spray, answers 201.

The verdict: the same writes straight to the apiserver (as the dry run kproxy would send) under
the same spray are all answered 201; through kproxy none may be refused."""

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
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .wire import Endpoint, exchange, request_bytes

#: Loopback source addresses the sprayer uses (the victim comes from 127.0.0.1) and connections per address.
SOURCES = [f"127.0.0.{n}" for n in range(20, 36)]
PER_SOURCE = 4
VICTIMS = 24


@dataclass
class Setup:
    cp: ControlPlaneInfo
    ns: str
    proxy: RunningProxy


def _create(cp: ControlPlaneInfo, path: str, obj: dict[str, object]) -> None:
    code, data = cp.request("POST", path, body=json.dumps(obj).encode())
    assert code == 201, data


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    cp = control_plane
    ns = f"redteam-tr-{secrets.token_hex(3)}"
    _create(cp, "/api/v1/namespaces", {"metadata": {"name": ns}})
    _create(cp, f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "bot"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    _create(
        cp,
        f"{rbac}/roles",
        {"metadata": {"name": "bot"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]},
    )
    _create(cp, f"{rbac}/rolebindings", {
        "metadata": {"name": "bot"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bot"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": ns}],
    })  # fmt: skip
    rule = {"name": "sa", "match": {"users": [f"system:serviceaccount:{ns}:*"]}, "action": "enforce"}
    rp = start_capped(tmp_path_factory.mktemp("redteam-tr"), cp, credentials="forward", tls=True,
                      extra={"filters": [{"name": "dryrun", "rules": [rule]}]})  # fmt: skip
    token = _tokens(cp, ns, 1)[0]
    path = f"/api/v1/namespaces/{ns}/configmaps"
    eventually(lambda: cp.request("GET", path, token=token)[0] == 200, 20, "RBAC")
    yield Setup(cp, ns, rp)
    rp.stop(signal.SIGKILL)
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")


def _tokens(cp: ControlPlaneInfo, ns: str, n: int) -> list[str]:
    """``n`` fresh tokens of the service account (as n pods of it would hold)."""
    out = []
    for _ in range(n):
        code, data = cp.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/bot/token",
            body=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}).encode(),
        )
        assert code == 201, data
        out.append(json.loads(data)["status"]["token"])
    return out


def _write(ns: str, token: str, query: str = "") -> bytes:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"v-{secrets.token_hex(4)}"}})
    headers = [
        ("Authorization", f"Bearer {token}"),
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
    ]
    return request_bytes("POST", f"/api/v1/namespaces/{ns}/configmaps{query}", headers, body.encode())


def _under_spray(ep: Endpoint, ns: str, tokens: list[str], query: str = "") -> tuple[list[int], dict[int, int]]:
    """The victims' statuses (one write per fresh token) while SOURCES spray random tokens."""
    stop = asyncio.Event()
    seen: dict[int, int] = {}

    async def sprayer(source: str) -> None:
        body = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"spray-"}}'
        while not stop.is_set():
            try:
                r, w = await asyncio.open_connection(ep.host, ep.port, ssl=ep.tls,
                                                     server_hostname=ep.host if ep.tls else None,
                                                     local_addr=(source, 0))  # fmt: skip
            except OSError:
                await asyncio.sleep(0.05)
                continue
            try:
                while not stop.is_set():
                    head = (
                        f"POST /api/v1/namespaces/{ns}/configmaps HTTP/1.1\r\nHost: x\r\n"
                        f"Authorization: Bearer {secrets.token_urlsafe(24)}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n"
                    )
                    w.write(head.encode() + body)
                    answer = await r.readuntil(b"\r\n\r\n")
                    status = int(answer.split()[1])
                    seen[status] = seen.get(status, 0) + 1
                    length = next((int(line.split(b":")[1]) for line in answer.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                    await r.readexactly(length)
                    if b"connection: close" in answer.lower():
                        break
            except (OSError, asyncio.IncompleteReadError, ValueError):
                pass
            finally:
                w.close()

    async def run() -> list[int]:
        tasks = [asyncio.create_task(sprayer(s)) for s in SOURCES for _ in range(PER_SOURCE)]
        try:
            deadline = time.monotonic() + 2
            while sum(seen.values()) < 200 and time.monotonic() < deadline + 10:
                await asyncio.sleep(0.1)
            statuses = []
            for token in tokens:
                answer = await asyncio.to_thread(exchange, ep, _write(ns, token, query), timeout=30)
                statuses.append(answer.status)
            return statuses
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    return asyncio.run(run()), seen


def test_a_token_sprayer_gets_no_legitimate_writer_refused(setup: Setup) -> None:
    cp = setup.cp
    direct = Endpoint("127.0.0.1", cp.apiserver_port, cp.ssl_context(client_cert=False))
    d_statuses, d_seen = _under_spray(direct, setup.ns, _tokens(cp, setup.ns, VICTIMS), "?dryRun=All")
    assert d_statuses == [201] * VICTIMS, f"the apiserver itself under the spray: {d_statuses} (spray: {d_seen})"

    via = Endpoint.from_url(setup.proxy.url, ssl.create_default_context(cafile=str(setup.proxy.ca_file)))
    statuses, seen = _under_spray(via, setup.ns, _tokens(cp, setup.ns, VICTIMS))
    refused = statuses.count(429)
    print(f"apiserver: {d_statuses.count(201)}/{VICTIMS} answered 201 (spray {d_seen}); "
          f"kproxy: {refused}/{VICTIMS} refused 429 (spray {seen})")  # fmt: skip
    assert refused == 0, (
        f"{refused} of {VICTIMS} writes by a legitimate service account, each with its own valid token, were "
        f"refused 429 through kproxy while {len(SOURCES) * PER_SOURCE} connections without credentials sprayed "
        f"random tokens ({seen}); the apiserver under the same spray answered all {VICTIMS}: {statuses}"
    )
