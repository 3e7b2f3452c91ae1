"""`credentials: impersonate`: a caller's own ``Impersonate-*`` headers, in every spelling a
request head can carry, never reach the apiserver as impersonation.

kproxy impersonates with its own rights, and its headers follow the caller's: a caller's
``Impersonate-User`` that survived kproxy and that the apiserver read as one would come first
(``Header.Get``) and make kproxy's rights the caller's. The apiserver reads the canonical key
only (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go, ``req.Header[...]``;
Go's net/textproto CanonicalMIMEHeaderKey folds ASCII letters only and refuses a name with any
byte outside the token set, as kproxy's parser does). Each raw request is sent through kproxy
and, as it is, straight to the apiserver with the same token: through kproxy the apiserver names
exactly the token's user, or kproxy refuses where Go's server refuses too."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .inventory_support import SSR, SSR_PATH, Seen, tls_with
from .wire import Endpoint, exchange

ADMIN = b"Impersonate-User: system:admin\r\nImpersonate-Group: system:masters\r\n"

#: Spellings kproxy refuses (400) where Go's server takes them (and the apiserver ignores the header).
KNOWN: dict[str, str] = {}

#: (extra head lines, chunked trailer lines) per spelling.
SPELLINGS: dict[str, tuple[bytes, bytes]] = {
    "canonical": (ADMIN, b""),
    "lower-case": (ADMIN.lower(), b""),
    "upper-case": (ADMIN.upper().replace(b"SYSTEM:", b"system:"), b""),
    "mixed-case": (b"iMpErSoNaTe-uSeR: system:admin\r\nimPERSONATE-group: system:masters\r\n", b""),
    "underscores": (b"Impersonate_User: system:admin\r\nImpersonate_Group: system:masters\r\n", b""),
    "two-user-lines": (b"Impersonate-User: system:admin\r\nImpersonate-User: system:admin\r\n", b""),
    "uid-and-extra": (
        b"Impersonate-User: system:admin\r\nImpersonate-Uid: 0\r\nImpersonate-Extra-Scopes: all\r\n",
        b"",
    ),
    "named-in-connection": (b"Connection: Impersonate-User, Impersonate-Group\r\n" + ADMIN, b""),
    "dotted-capital-i": ("\u0130mpersonate-User: system:admin\r\n".encode(), b""),
    "latin1-byte-in-name": (b"Impersonate-User\xa0: system:admin\r\n", b""),
    "tab-before-colon": (b"Impersonate-User\t: system:admin\r\n", b""),
    "leading-space-line": (b" Impersonate-User: system:admin\r\n", b""),
    "value-with-blanks": (b"Impersonate-User:  \t system:admin \t\r\n", b""),
    "empty-user-with-group": (b"Impersonate-User:\r\nImpersonate-Group: system:masters\r\n", b""),
    "chunked-trailer": (b"", ADMIN),
    # An upgrade request goes upstream on its own connection (kproxy.server.upgrade), with the
    # same headers; the apiserver serves a POST carrying Upgrade as an ordinary request.
    "canonical-on-upgrade": (b"Connection: Upgrade\r\nUpgrade: websocket\r\n" + ADMIN, b""),
    "lower-case-on-upgrade": (b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n" + ADMIN.lower(), b""),
}


def _raw(token: str, lines: bytes, trailer: bytes, *, version: bytes = b"HTTP/1.1") -> bytes:
    head = (
        b"POST " + SSR_PATH.encode() + b" " + version + b"\r\nHost: localhost\r\n"
        b"Accept: application/json\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + token.encode() + b"\r\n" + lines
    )
    if trailer:
        body = f"{len(SSR):x}\r\n".encode() + SSR + b"\r\n0\r\n" + trailer + b"\r\n"
        return head + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body
    return head + f"Content-Length: {len(SSR)}\r\nConnection: close\r\n\r\n".encode() + SSR


@pytest.fixture(scope="module")
def imp(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    rp = start_capped(tmp_path_factory.mktemp("inv-spell"), control_plane, credentials="impersonate", tls=True)
    yield rp
    rp.stop(signal.SIGKILL)


@pytest.mark.parametrize(
    "spelling,version",
    [
        pytest.param(
            name,
            version,
            id=f"{name}-{label}",
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN[name])] if name in KNOWN else [],
        )
        for name, (_, trailer) in SPELLINGS.items()
        for version, label in ((b"HTTP/1.1", "http11"), (b"HTTP/1.0", "http10"))
        if not (trailer and version == b"HTTP/1.0")  # HTTP/1.0 has no chunked body, so no trailer
    ],
)
def test_callers_impersonation_headers_never_reach_the_apiserver(
    spelling: str, version: bytes, imp: RunningProxy, control_plane: ControlPlaneInfo
) -> None:
    token = control_plane.user_token
    assert imp.ca_file is not None
    via_ep = Endpoint.from_url(imp.url, tls_with(None, imp.ca_file, Path()))
    direct_ep = Endpoint("127.0.0.1", control_plane.apiserver_port, control_plane.ssl_context(client_cert=False))
    plain = Seen.of(exchange(direct_ep, _raw(token, b"", b"", version=version)))
    assert plain.user == control_plane.user_name, plain

    raw = _raw(token, *SPELLINGS[spelling], version=version)
    via_answer = exchange(via_ep, raw)
    direct_answer = exchange(direct_ep, raw)
    via = Seen.of(via_answer)
    assert imp.proc.poll() is None, "kproxy exited"
    if via.status == 201:
        assert via.who() == plain.who(), f"through kproxy the apiserver named {via}; raw={raw!r}"
    else:
        # Refused: only where Go's server refuses the same bytes.
        assert (via_answer.status, direct_answer.status) == (400, 400), (via_answer.short(), direct_answer.short())
