"""The one length-delimited writer (``ld``) and the one field reader (``iter_fields``)."""

from __future__ import annotations

import pytest

from kproxy.codec.codecerrors import CodecError
from kproxy.codec.envelope import encode_varint, iter_fields, ld


def test_ld_writes_key_length_payload() -> None:
    assert ld(1, b"ab") == b"\x0a\x02ab"
    assert ld(2, b"") == b"\x12\x00"
    assert ld(16, b"x") == b"\x82\x01\x01x"  # a two-byte key
    assert ld(3000, b"y" * 300) == encode_varint(3000 << 3 | 2) + b"\xac\x02" + b"y" * 300


def test_iter_fields_spans_every_wire_type() -> None:
    msg = ld(1, b"name") + b"\x10\x96\x01" + b"\x19" + b"\x00" * 8 + b"\x25" + b"\x00" * 4 + ld(1, b"")
    fields = list(iter_fields(msg))
    assert [(n, w) for n, w, *_ in fields] == [(1, 2), (2, 0), (3, 1), (4, 5), (1, 2)]
    _, _, start, value, end = fields[0]
    assert msg[start:end] == ld(1, b"name") and msg[value:end] == b"name"
    assert b"".join(msg[s:e] for _, _, s, _, e in fields) == msg


@pytest.mark.parametrize("bad", [b"\x0a\x05abc", b"\x0b", b"\x19\x00", b"\x10\x80"])
def test_iter_fields_refuses_truncated_or_unknown(bad: bytes) -> None:
    with pytest.raises(CodecError):
        list(iter_fields(bad))
