"""Accept-Encoding negotiation (RFC 9110 12.5.3) and the header rules, as pure logic."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from kproxy.compress.headers import add_vary, mark_encoded, no_transform
from kproxy.compress.negotiate import Negotiated, negotiate, parse

OFFER = ("zstd", "gzip")


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([], Negotiated(None)),  # no header: no compression (kubectl --disable-compression)
        ([""], Negotiated(None)),
        (["gzip"], Negotiated("gzip")),
        (["gzip, zstd"], Negotiated("zstd")),  # tie: offer order
        (["zstd;q=0.5, gzip"], Negotiated("gzip")),
        (["gzip;q=0"], Negotiated(None)),
        (["gzip;q=0, *"], Negotiated("zstd")),
        (["*"], Negotiated("zstd")),
        (["*;q=0"], Negotiated(None, identity_ok=False)),
        (["*;q=0, identity"], Negotiated(None, identity_ok=True)),
        (["identity;q=0"], Negotiated(None, identity_ok=False)),
        (["gzip, identity;q=0"], Negotiated("gzip", identity_ok=False)),
        (["identity, gzip;q=0.5"], Negotiated(None)),
        (["identity;q=0.1, gzip;q=0.5"], Negotiated("gzip")),
        (["gzip;q=0.5"], Negotiated("gzip")),  # identity unnamed does not outrank it
        (["GZip; Q=1.0"], Negotiated("gzip")),
        (["x-gzip"], Negotiated("gzip")),
        (["br", "gzip;q=0.2"], Negotiated("gzip")),  # several lines
        (["br, deflate, compress"], Negotiated(None)),
        (["gzip;q=2"], Negotiated(None)),  # out of range q: refused, never an error
        (["gzip;q=abc, zstd;q=0.001"], Negotiated("zstd")),
        (["gzip, gzip;q=0"], Negotiated("gzip")),  # the most favourable mention
        ([" , ,gzip ,"], Negotiated("gzip")),
    ],
)
def test_negotiate(lines: list[str], expected: Negotiated) -> None:
    assert negotiate(lines, OFFER) == expected


def test_preference_order_is_the_operators() -> None:
    assert negotiate(["zstd, gzip"], ("gzip", "zstd")) == Negotiated("gzip")
    assert negotiate(["zstd"], ("gzip",)) == Negotiated(None)


def test_parse() -> None:
    assert parse(["gzip;q=0.5;foo=bar", "ZSTD", "x-gzip;q=0.7"]) == {"gzip": 0.7, "zstd": 1.0}


def test_mark_encoded_headers() -> None:
    h = CIMultiDict([("Content-Length", "10"), ("Vary", "Accept"), ("ETag", '"abc"')])
    mark_encoded(h, "zstd")
    assert h["Content-Encoding"] == "zstd"
    assert "Content-Length" not in h
    assert h.getall("Vary") == ["Accept", "Accept-Encoding"]
    assert h["ETag"] == '"abc"'  # the apiserver's tag, as its own gzip leaves it
    add_vary(h)  # not repeated
    assert h.getall("Vary") == ["Accept", "Accept-Encoding"]
    h2 = CIMultiDict([("Vary", "*"), ("ETag", 'W/"x"')])
    mark_encoded(h2, "gzip")
    assert h2.getall("Vary") == ["*"]
    assert h2["ETag"] == 'W/"x"'


def test_no_transform() -> None:
    h = CIMultiDict([("Cache-Control", "max-age=0, No-Transform")])
    assert no_transform(h)
    assert not no_transform(CIMultiDict([("Cache-Control", "no-cache")]))
