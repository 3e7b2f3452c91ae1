"""kproxy.identity.certname against Go's crypto/x509 parser (parser.go ``parseName``,
``parseASN1String``, cryptobyte's DER rules; expectations from its source). The e2e comparison
with the apiserver's own handshake: tests/adversarial/test_inventory_x509.py."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization

from kproxy.identity.certname import certificate_subject
from kproxy.localcluster import certs

CN = (2, 5, 4, 3)


def _tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    length = (
        bytes([n])
        if n < 0x80
        else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + n.to_bytes((n.bit_length() + 7) // 8, "big")
    )
    return bytes([tag]) + length + content


def _cert(subject_value: bytes, tag: int, issuer: bytes = b"") -> bytes:
    """A certificate frame whose subject is one CN of this string type (nothing after the subject
    is read)."""
    cn = _tlv(0x31, _tlv(0x30, _tlv(0x06, b"\x55\x04\x03") + _tlv(tag, subject_value)))
    tbs = (
        _tlv(0xA0, _tlv(0x02, b"\x02"))
        + _tlv(0x02, b"\x01")
        + _tlv(0x30, _tlv(0x06, b"\x2a\x86\x48\xce\x3d\x04\x03\x02"))
        + _tlv(0x30, issuer)
        + _tlv(0x30, b"")
        + _tlv(0x30, cn)
    )
    return _tlv(0x30, _tlv(0x30, tbs))


@pytest.mark.parametrize(
    "tag,value,want",
    [
        (0x13, b"ab*&?:=", "ab*&?:="),  # PrintableString, with the '*' and '&' Go permits
        (0x13, b"a@b", None),
        (0x13, b"a_b", None),
        (0x0C, "é".encode(), "é"),
        (0x0C, b"\xed\xa0\x80", None),  # an encoded surrogate is not UTF-8 to Go
        (0x0C, b"\xc0\xaf", None),  # overlong
        (0x14, b"\xe9", "é"),  # T61String read as Latin-1
        (0x16, b"ab", "ab"),
        (0x16, b"\x80", None),
        (0x12, b"12 3", "12 3"),
        (0x12, b"12a", None),
        (0x1E, b"\x00a\x00b\x00\x00", "ab"),  # BMPString, its terminator stripped
        (0x1E, b"\xd8\x00", None),
        (0x1E, b"\x00", None),
        (0x1C, b"\x00\x00\x00a", None),  # UniversalString
        (0x02, b"\x01", None),  # not a string at all
    ],
)
def test_string_types_are_gos(tag: int, value: bytes, want: str | None) -> None:
    der = _cert(value, tag)
    if want is None:
        with pytest.raises(ValueError):
            certificate_subject(der)
    else:
        assert certificate_subject(der) == [(CN, want)]


def test_der_framing_is_cryptobytes() -> None:
    good = _cert(b"u", 0x0C)
    assert certificate_subject(good) == [(CN, "u")]
    # A long-form length where the short form fits (non-minimal): refused.
    bad = good.replace(b"\x0c\x01u", b"\x0c\x81\x01u")
    with pytest.raises(ValueError):
        certificate_subject(bad)
    # An unreadable issuer refuses the certificate too.
    issuer = _tlv(0x31, _tlv(0x30, _tlv(0x06, b"\x55\x04\x0a") + _tlv(0x1C, b"\x00\x00\x00a")))
    with pytest.raises(ValueError):
        certificate_subject(_cert(b"u", 0x0C, issuer))


def test_a_real_certificate() -> None:
    leaf = certs.generate_client_cert(certs.generate_ca("inv-ca"), "u", ["g2", "g1"])
    got = certificate_subject(leaf.cert.public_bytes(serialization.Encoding.DER))
    assert [v for oid, v in got if oid == CN] == ["u"]
    assert [v for oid, v in got if oid == (2, 5, 4, 10)] == ["g2", "g1"]
