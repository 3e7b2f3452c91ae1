"""kproxy.identity.authn.caller_tokens: the tokens the apiserver's token authenticators would try, in order
(bearertoken.go, then websocket/protocol.go for WebSocket requests only), and which requests fail
before any review. The end-to-end comparison with the apiserver is tests/e2e/test_auth_websocket_protocol.py."""

from __future__ import annotations

import base64

import pytest
from multidict import CIMultiDict

from kproxy.identity.authn import caller_tokens, without_token_protocol

P = "base64url.bearer.authorization.k8s.io."
WS = {"Upgrade": "websocket", "Connection": "Upgrade"}
NOT_UTF8 = P + base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("=")


def enc(token: str) -> str:
    return P + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({}, ([], False)),
        ({"Authorization": "Bearer a"}, ([("a", False)], False)),
        # Not a WebSocket request: the protocol header is ignored.
        ({"Sec-WebSocket-Protocol": f"{enc('t')}, v4.channel.k8s.io"}, ([], False)),
        ({"Upgrade": "websocket", "Sec-WebSocket-Protocol": f"{enc('t')}, x"}, ([], False)),
        ({"Connection": "Upgrade", "Sec-WebSocket-Protocol": f"{enc('t')}, x"}, ([], False)),
        ({**WS, "Upgrade": "h2c", "Sec-WebSocket-Protocol": f"{enc('t')}, x"}, ([], False)),
        # WebSocket requests.
        ({**WS, "Sec-WebSocket-Protocol": f"{enc('t')}, x"}, ([("t", True)], False)),
        (
            {**WS, "Connection": "keep-alive, Upgrade", "Sec-WebSocket-Protocol": f"x,{enc('t')}"},
            ([("t", True)], False),
        ),
        (
            {**WS, "Authorization": "Bearer a", "Sec-WebSocket-Protocol": f"{enc('t')}, x"},
            ([("a", False), ("t", True)], False),
        ),
        ({**WS, "Sec-WebSocket-Protocol": enc("t")}, ([], True)),  # no other protocol
        ({**WS, "Sec-WebSocket-Protocol": f"{enc('t')}, {enc('u')}, x"}, ([], True)),  # two tokens
        ({**WS, "Sec-WebSocket-Protocol": f"{enc('tt')}=, x"}, ([], True)),  # padding
        ({**WS, "Sec-WebSocket-Protocol": f"{P}a$b, x"}, ([], True)),  # not the URL alphabet
        (
            {**WS, "Sec-WebSocket-Protocol": NOT_UTF8 + ", x"},
            ([], True),
        ),
        ({**WS, "Sec-WebSocket-Protocol": f"{P}, x"}, ([], False)),  # empty token: none
        ({**WS, "Sec-WebSocket-Protocol": "x"}, ([], False)),
    ],
)
def test_caller_tokens(headers: dict[str, str], want: tuple[list[tuple[str, bool]], bool]) -> None:
    assert caller_tokens(CIMultiDict(headers)) == want


def test_protocol_split_over_header_lines() -> None:
    headers: CIMultiDict[str] = CIMultiDict(WS)
    headers.add("Sec-WebSocket-Protocol", enc("t"))
    headers.add("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
    assert caller_tokens(headers) == ([("t", True)], False)
    without_token_protocol(headers)
    assert headers.getall("Sec-WebSocket-Protocol") == ["v4.channel.k8s.io"]
