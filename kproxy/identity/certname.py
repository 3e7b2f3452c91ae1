"""A certificate's subject as Go's ``crypto/x509`` reads it (src/crypto/x509/parser.go
``parseCertificate``, ``parseName``, ``parseASN1String``).

OpenSSL, which verifies callers' certificates during kproxy's handshake, reads more than Go: a
name attribute in any string type (UniversalString, ...), a PrintableString with ``@`` or
``_``. The apiserver's TLS handshake fails on such a certificate, so kproxy must not name its
holder either. Only the parts Go's parser applies to the names are ported here: the DER
framing (``cryptobyte``: definite, minimal lengths, low tag numbers), object identifiers
(minimal base-128), and the string types of ``parseASN1String`` with their checks. The issuer
is read as well, since Go refuses a certificate whose issuer it cannot read.
"""

from __future__ import annotations

__all__ = ["certificate_subject"]

# ASN.1 universal tags.
_SEQUENCE, _SET, _OID, _INTEGER = 0x30, 0x31, 0x06, 0x02
_UTF8, _NUMERIC, _PRINTABLE, _T61, _IA5, _BMP = 0x0C, 0x12, 0x13, 0x14, 0x16, 0x1E
_VERSION = 0xA0  # [0] EXPLICIT


def _read(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """One element at ``pos``: (tag, start of its contents, end of its contents), as
    ``cryptobyte.String.ReadAnyASN1`` accepts it; ValueError otherwise."""
    if pos + 2 > end:
        raise ValueError("truncated element")
    tag = buf[pos]
    if tag & 0x1F == 0x1F:
        raise ValueError("high tag number")
    first = buf[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or pos + n > end:
            raise ValueError("bad length")
        length = int.from_bytes(buf[pos : pos + n], "big")
        if length < 0x80 or buf[pos] == 0:
            raise ValueError("non-minimal length")
        pos += n
    if pos + length > end:
        raise ValueError("truncated element")
    return tag, pos, pos + length


def _expect(buf: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    got, start, stop = _read(buf, pos, end)
    if got != tag:
        raise ValueError(f"expected tag {tag:#x}, found {got:#x}")
    return start, stop


def _oid(raw: bytes) -> tuple[int, ...]:
    """``ReadASN1ObjectIdentifier``: base-128 components, each minimal; the first two in one."""
    if not raw:
        raise ValueError("empty object identifier")
    parts: list[int] = []
    value, fresh = 0, True
    for b in raw:
        if fresh and b == 0x80:
            raise ValueError("non-minimal object identifier")
        value = (value << 7) | (b & 0x7F)
        fresh = not b & 0x80
        if fresh:
            parts.append(value)
            value = 0
    if not fresh:
        raise ValueError("truncated object identifier")
    first = parts[0]
    head = (first // 40, first % 40) if first < 80 else (2, first - 80)
    return (*head, *parts[1:])


def _printable(b: int) -> bool:
    """parser.go ``isPrintable`` (with the ``*`` and ``&`` Go permits)."""
    c = chr(b)
    return c.isascii() and (c.isalnum() or c in " '()+,-./:=?*&")


def _string(tag: int, value: bytes) -> str:
    """parser.go ``parseASN1String``."""
    if tag == _T61:
        return value.decode("latin-1")
    if tag == _PRINTABLE:
        if not all(_printable(b) for b in value):
            raise ValueError("invalid PrintableString")
        return value.decode("ascii")
    if tag == _UTF8:
        try:
            return value.decode("utf-8")  # utf8.Valid: no surrogates, no overlong forms
        except UnicodeDecodeError:
            raise ValueError("invalid UTF-8 string") from None
    if tag == _BMP:
        if len(value) % 2:
            raise ValueError("invalid BMPString")
        if len(value) >= 2 and value[-2:] == b"\0\0":
            value = value[:-2]
        units = [int.from_bytes(value[i : i + 2], "big") for i in range(0, len(value), 2)]
        if any(u in (0xFFFE, 0xFFFF) or 0xFDD0 <= u <= 0xFDEF or 0xD800 <= u <= 0xDFFF for u in units):
            raise ValueError("invalid BMPString")
        return "".join(map(chr, units))
    if tag == _IA5:
        if any(b >= 0x80 for b in value):
            raise ValueError("invalid IA5String")
        return value.decode("ascii")
    if tag == _NUMERIC:
        if any(not (0x30 <= b <= 0x39 or b == 0x20) for b in value):
            raise ValueError("invalid NumericString")
        return value.decode("ascii")
    raise ValueError(f"unsupported string type: {tag}")


def _name(buf: bytes, start: int, end: int) -> list[tuple[tuple[int, ...], str]]:
    """parser.go ``parseName``: every attribute of every RDN, in order."""
    out: list[tuple[tuple[int, ...], str]] = []
    pos = start
    while pos < end:
        set_start, set_end = _expect(buf, pos, end, _SET)
        p = set_start
        while p < set_end:
            atav_start, atav_end = _expect(buf, p, set_end, _SEQUENCE)
            oid_start, oid_end = _expect(buf, atav_start, atav_end, _OID)
            tag, v_start, v_end = _read(buf, oid_end, atav_end)
            out.append((_oid(buf[oid_start:oid_end]), _string(tag, buf[v_start:v_end])))
            p = atav_end
        pos = set_end
    return out


def certificate_subject(der: bytes) -> list[tuple[tuple[int, ...], str]]:
    """The subject's attributes ``(oid, value)`` in order, as Go reads them; ValueError where Go's
    parser refuses the certificate's issuer or subject."""
    cert_start, cert_end = _expect(der, 0, len(der), _SEQUENCE)
    tbs_start, tbs_end = _expect(der, cert_start, cert_end, _SEQUENCE)
    tag, _, pos = _read(der, tbs_start, tbs_end)
    if tag == _VERSION:
        tag, _, pos = _read(der, pos, tbs_end)
    if tag != _INTEGER:
        raise ValueError("no serial number")
    _, pos = _expect(der, pos, tbs_end, _SEQUENCE)  # signature algorithm
    issuer_start, pos = _expect(der, pos, tbs_end, _SEQUENCE)
    _name(der, issuer_start, pos)
    _, pos = _expect(der, pos, tbs_end, _SEQUENCE)  # validity
    subject_start, subject_end = _expect(der, pos, tbs_end, _SEQUENCE)
    return _name(der, subject_start, subject_end)
