"""HPACK's Huffman decoding (RFC 7541 5.2, Appendix B) a byte at a time.

hpack's ``decode_huffman`` walks a table a nibble at a time: two lookups, two flag tests and a
possible append per input byte, in Python. This decoder's table is built once, at import, from the
code table hpack ships (``hpack.huffman_constants``), as the finite-state decoder nghttp2 and Go's
hpack use: for each state (a node of the code tree where the bits read since the last symbol
lead) and each input byte, the state after the byte and the symbols it completes (at most two:
the shortest code has 5 bits). It refuses what hpack's decoder refuses, with the same errors: a
string that holds the EOS symbol ("Invalid Huffman string"), and one that ends inside a symbol
other than in padding of at most 7 bits of the EOS code's leading ones ("Incomplete Huffman
string"; Go's hpack/huffman.go ``huffmanDecode`` refuses both). Half the instructions of hpack's
for the apiserver's ``audit-id`` and ``date`` values; the tables take about 1.8 MiB, built in
about 15 ms on the first Huffman-coded string (not at import: a restart's first answers from a
persisted cache do not wait for them)."""

from __future__ import annotations

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

_EOS = 256


def _build() -> tuple[list[int], list[bytes], frozenset[int], int]:
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
    # Two tables, by ``state << 8 | byte``: the next state, already shifted (``state << 8``: one
    # shared int object per state), and the symbols completed (shared objects: one per distinct
    # output). About 1.8 MiB (0.5 of it the states); a tuple per entry was 6.
    shifted = [state << 8 for state in range(nodes + 1)]
    states: list[int] = []
    outputs: list[bytes] = []
    shared: dict[bytes, bytes] = {}
    for state in range(nodes):
        for high, first in nibbles[state * 16 : state * 16 + 16]:
            if high == dead:
                states.extend([shifted[dead]] * 16)
                outputs.extend([b""] * 16)
                continue
            for low, second in nibbles[high * 16 : high * 16 + 16]:
                pair = first + second
                states.append(shifted[low])
                outputs.append(shared.setdefault(pair, pair))
    states.extend([shifted[dead]] * 256)
    outputs.extend([b""] * 256)
    return states, outputs, frozenset(shifted[a] for a in accepting), shifted[dead]


_tables: tuple[list[int], list[bytes], frozenset[int], int] | None = None


def decode_huffman(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` decoded; hpack's ``decode_huffman``'s result and errors."""
    global _tables
    if not data:
        return b""
    if _tables is None:
        _tables = _build()
    states, outputs, accepting, dead = _tables
    state = 0
    out = bytearray()
    for byte in data:
        entry = state | byte  # states hold the next state shifted: ``state << 8``
        out += outputs[entry]
        state = states[entry]
    if state not in accepting:
        if state == dead:
            raise HPACKDecodingError("Invalid Huffman string")
        raise HPACKDecodingError("Incomplete Huffman string")
    return bytes(out)
