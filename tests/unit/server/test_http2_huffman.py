"""kproxy's byte-at-a-time HPACK Huffman decoder against hpack's: the same strings for every input,
the same refusals (the EOS symbol, padding that is not the EOS code's leading ones or is longer
than 7 bits, a string cut inside a symbol)."""

from __future__ import annotations

import random

import pytest
from hpack import Decoder, Encoder
from hpack.exceptions import HPACKDecodingError
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.huffman_table import decode_huffman as hpack_decode_huffman

from kproxy.server.http2.goframes import TruncatingDecoder
from kproxy.server.http2.huffman import decode_huffman

ENCODER = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def outcome(decode: object, data: bytes) -> object:
    try:
        return decode(data)  # type: ignore[operator]
    except HPACKDecodingError as exc:
        return ("refused", str(exc))


def same(data: bytes) -> None:
    assert outcome(decode_huffman, data) == outcome(hpack_decode_huffman, data), data.hex()


def bits(text: str) -> bytes:
    """A bit string (spaces ignored) as bytes; its length must be a multiple of 8."""
    text = text.replace(" ", "")
    assert len(text) % 8 == 0
    return int(text, 2).to_bytes(len(text) // 8, "big") if text else b""


def test_rfc7541_examples() -> None:
    # RFC 7541 C.4.1-C.4.3 and C.6.1 Huffman strings.
    cases = {
        "f1e3c2e5f23a6ba0ab90f4ff": b"www.example.com",
        "a8eb10649cbf": b"no-cache",
        "25a849e95ba97d7f": b"custom-key",
        "25a849e95bb8e8b4bf": b"custom-value",
        "6402": b"302",
        "aec3771a4b": b"private",
        "d07abe941054d444a8200595040b8166e082a62d1bff": b"Mon, 21 Oct 2013 20:13:21 GMT",
        "9d29ad171863c78f0b97c8e9ae82ae43d3": b"https://www.example.com",
    }
    for hexed, plain in cases.items():
        assert decode_huffman(bytes.fromhex(hexed)) == plain
        same(bytes.fromhex(hexed))


def test_every_symbol_and_random_strings() -> None:
    rng = random.Random(7541)
    everything = bytes(range(256))
    assert decode_huffman(ENCODER.encode(everything)) == everything
    for _ in range(3000):
        plain = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        coded = ENCODER.encode(plain)
        assert decode_huffman(coded) == plain
        same(coded)


def test_random_and_hostile_bytes_refused_as_hpack_refuses() -> None:
    rng = random.Random(29)
    for _ in range(20000):
        kind = rng.randrange(4)
        if kind == 0:  # any bytes
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
        elif kind == 1:  # a good string with padding-like bytes after it
            data = ENCODER.encode(bytes(rng.randrange(256) for _ in range(rng.randrange(8))))
            data += bytes(rng.choice((0xFF, 0xFE, 0x7F, 0x80, 0x00)) for _ in range(rng.randrange(3)))
        elif kind == 2:  # a good string cut short
            data = ENCODER.encode(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))))
            data = data[: rng.randrange(len(data) + 1)]
        else:  # runs of ones (the EOS code is 30 of them) and zeros
            data = bytes(rng.choice((0xFF, 0xFE, 0xFC, 0xF8, 0x3F, 0x00)) for _ in range(rng.randrange(6)))
        same(data)


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        (b"\xff\xff\xff\xff", "Invalid Huffman string"),  # the EOS symbol (30 ones) in the string
        (b"\x1f" + b"\xff\xff\xff\xfc", "Invalid Huffman string"),  # "a" (00011), then EOS
        (bits("00011 111 11111111"), "Incomplete Huffman string"),  # "a", then 11 bits of padding
        (b"\xff", "Incomplete Huffman string"),  # 8 bits of padding alone
        (bits("00011 000"), "Incomplete Huffman string"),  # padding of zeros
        (bits("00011 101"), "Incomplete Huffman string"),  # padding that is not the EOS's ones
        (bits("1111111111 111111"), "Incomplete Huffman string"),  # cut inside a long symbol
    ],
)
def test_hostile_strings(data: bytes, refusal: str) -> None:
    with pytest.raises(HPACKDecodingError, match=refusal):
        decode_huffman(data)
    same(data)


def test_padding_of_up_to_seven_ones_is_accepted() -> None:
    assert decode_huffman(bits("00011 111")) == b"a"  # 3 bits of padding
    assert decode_huffman(bits("00011 00011 111111")) == b"aa"  # 6
    assert decode_huffman(bits("00011" * 5 + "1111111")) == b"aaaaa"  # 7
    with pytest.raises(HPACKDecodingError, match="Incomplete Huffman string"):
        decode_huffman(bits("00011" * 8 + "11111111"))  # 8
    for data in (bits("00011 111"), bits("00011 00011 111111"), bits("00011" * 5 + "1111111")):
        same(data)
    same(bits("00011" * 8 + "11111111"))


def test_header_blocks_decode_as_hpack_decodes() -> None:
    rng = random.Random(2)
    for _ in range(300):
        fields = [
            (b"audit-id", bytes(rng.randrange(32, 127) for _ in range(36))),
            (b"date", b"Sun, 29 Nov 2026 03:05:%02d GMT" % rng.randrange(60)),
            (b"x-odd", bytes(rng.randrange(256) for _ in range(rng.randrange(20)))),
        ]
        block = Encoder().encode(fields, huffman=True)
        ours = TruncatingDecoder(Decoder(), truncate=False).decode(block, raw=True)
        assert ours == Decoder().decode(block, raw=True) == fields
