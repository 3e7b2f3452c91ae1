"""HPACK's Huffman decoding (RFC 7541 5.2, Appendix B) a byte at a time.

hpack's ``decode_huffman`` walks a table a nibble at a time: two lookups, two flag tests and a
possible append per input byte, in Python. This decoder's table is built once, at import, from the
code table hpack ships (``hpack.huffman_constants``), as the finite-state decoder nghttp2 and Go's
hpack use: for each state (a node of the code tree where the bits read since the last symbol
lead) and each input byte, the state after the byte and the symbols it completes (at most two:
the shortest code has 5 bits). It refuses what hpack's decoder refuses, with the same errors: a
string that holds the EOS symbol ("Invalid Huffman string"), and one that ends inside a symbol
other than in padding of at most 7 bits of the EOS code's leading ones ("Incomplete Huffman
string"; Go's hpack/huffman.go ``huffmanDecode`` refuses both)."""

from __future__ import annotations

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

_EOS = 256


def _build() -> tuple[list[tuple[int, bytes]], frozenset[int], int]:
    # The code tree: internal nodes numbered from 0 (the root); children[node] = [zero, one],
    # each a node number or a leaf ~symbol (negative).
    children: list[list[int | None]] = [[None, None]]
    for symbol, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            child = children[node][bit]
            if child is None:
                child = len(children)
                children.append([None, None])
                children[node][bit] = child
            assert child >= 0
            node = child
        children[node][code & 1] = ~symbol
    nodes = len(children)
    # Accepting states: the root, and the nodes the EOS code's leading ones reach in at most 7 bits.
    accepting = {0}
    node = 0
    for _ in range(7):
        child = children[node][1]
        assert child is not None and child >= 0
        node = child
        accepting.add(node)
    dead = nodes  # past an EOS symbol: stays there, and refused at the end
    # A nibble at a time first, then each byte as its two nibbles.
    nibbles: list[tuple[int, bytes]] = []
    for state in range(nodes):
        for nibble in range(16):
            node, out = state, bytearray()
            for shift in (3, 2, 1, 0):
                child = children[node][(nibble >> shift) & 1]
                assert child is not None
                if child >= 0:
                    node = child
                    continue
                if ~child == _EOS:
                    node = dead
                    break
                out.append(~child)
                node = 0
            nibbles.append((node, bytes(out)))
    nibbles.extend([(dead, b"")] * 16)
    table: list[tuple[int, bytes]] = []
    for state in range(nodes):
        row = nibbles[state * 16 : state * 16 + 16]
        for high, first in row:
            if high == dead:
                table.extend([(dead, b"")] * 16)
                continue
            base = high * 16
            for low, second in nibbles[base : base + 16]:
                table.append((low, first + second))
    table.extend([(dead, b"")] * 256)
    return table, frozenset(accepting), dead


_TABLE, _ACCEPTING, _DEAD = _build()


def decode_huffman(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` decoded; hpack's ``decode_huffman``'s result and errors."""
    if not data:
        return b""
    table = _TABLE
    state = 0
    out = bytearray()
    for byte in data:
        state, symbols = table[(state << 8) | byte]
        out += symbols
    if state not in _ACCEPTING:
        if state == _DEAD:
            raise HPACKDecodingError("Invalid Huffman string")
        raise HPACKDecodingError("Incomplete Huffman string")
    return bytes(out)
