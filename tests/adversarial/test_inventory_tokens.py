"""Bearer tokens with bytes that are not UTF-8, in ``forward`` and ``impersonate`` modes.

The apiserver's token authenticators compare a token's bytes (staging/src/k8s.io/apiserver/pkg/
authentication/request/bearertoken/bearertoken.go hands them on as they came); such a token
names no one there: its 401. kproxy learns who a token names through a TokenReview, a JSON body,
which cannot carry those bytes: it must still answer the apiserver's 401, never a 500 because
the review could not be written (kproxy's promise: no 5xx where the apiserver gives none)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .bodies import cm_json
from .conftest import start_capped
from .inventory_support import tls_with
from .wire import Endpoint, exchange, request_bytes


@pytest.fixture(scope="module", params=["impersonate", "forward"])
def tokens_proxy(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """``forward`` with a dryrun rule by user, so that kproxy asks who the caller is."""
    mode: str = request.param
    rules = [{"name": "someone", "match": {"users": ["inv-someone"]}, "action": "enforce"}]
    extra = {"filters": [{"name": "dryrun", "rules": rules}]} if mode == "forward" else None
    rp = start_capped(tmp_path_factory.mktemp(f"inv-tokens-{mode}"), control_plane, credentials=mode, tls=True,
                      extra=extra)  # fmt: skip
    yield rp
    rp.stop(signal.SIGKILL)


@pytest.mark.parametrize("suffix", ["\x80", "\xff\xfe", "\xc3"], ids=["continuation", "ff-fe", "truncated"])
def test_a_token_that_is_not_utf8_gets_the_apiservers_401(
    suffix: str, tokens_proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    assert tokens_proxy.ca_file is not None
    # request_bytes writes latin-1: each character of ``suffix`` is one byte on the wire.
    headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
        ("Authorization", f"Bearer {control_plane.user_token}{suffix}"),
    ]
    raw = request_bytes("POST", f"/api/v1/namespaces/{namespace}/configmaps", headers, cm_json("not-utf8"))
    direct = exchange(
        Endpoint("127.0.0.1", control_plane.apiserver_port, control_plane.ssl_context(client_cert=False)), raw
    )
    via = exchange(Endpoint.from_url(tokens_proxy.url, tls_with(None, tokens_proxy.ca_file, tmp_path)), raw)
    assert direct.status == 401, direct.short()
    assert (via.status, via.is_status()) == (401, True), via.short()
    assert via.json() == direct.json(), (via.short(), direct.short())
    code, _ = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/not-utf8")
    assert code == 404
