"""Watch-list gzip members are laid out as Go's writer leaves them after Flush then Close, so a
streaming reader gets a member's events before the next member starts (client-go, through Go's
``gzip.Reader``, holds back data that shares the final block until it has read the next header)."""

from __future__ import annotations

import gzip
import zlib

from kproxy.filters.watchcache.watches import WATCH_LIST_GZIP

gzip_member = WATCH_LIST_GZIP.solo

FINAL_EMPTY_BLOCK_AND_TRAILER = 2 + 8  # BFINAL fixed-Huffman empty block, CRC-32, ISIZE


def test_member_is_complete_gzip() -> None:
    data = b'{"type":"BOOKMARK","object":{}}\n' * 20
    assert gzip.decompress(gzip_member(data)) == data
    assert gzip.decompress(gzip_member(data) + gzip_member(b"more\n")) == data + b"more\n"


def test_the_data_is_readable_before_the_final_block() -> None:
    data = b"event-1\nevent-2\n"
    member = gzip_member(data)
    assert member.endswith(b"\x03\x00" + member[-8:])  # an empty final block, then the trailer
    before_final = member[:-FINAL_EMPTY_BLOCK_AND_TRAILER]
    assert before_final.endswith(b"\x00\x00\xff\xff")  # the sync-flush marker
    assert zlib.decompressobj(31).decompress(before_final) == data
