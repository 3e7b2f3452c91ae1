"""Compressed watches that share one compressor stream (``kproxy.cacher.shared_stream``).

Real zstd and gzip codecs, fake sinks and frames: every watcher's bytes must decode (several frames
in a row) to exactly what an uncompressed twin registered at the same moment receives, each write
decodable at once, while watchers join, leave (private bookmarks, full connections, closes) and
the shared stream starts new frames. The end-to-end tests against the apiserver are in
tests/e2e/test_compression_cached_watches.py.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from typing import Any

import pytest
from backports import zstd
from test_cache_broadcaster import Sink as PlainSink

from kproxy.cacher import MODIFIED, CachedObject, Kind, WatchCache
from kproxy.cacher.broadcaster import Broadcaster, Selection, Watcher
from kproxy.cacher.shared_stream import RESTART_AFTER
from kproxy.compress.backends import gzip_codec, zstd_codec
from kproxy.compress.shared import SharedFrame, WatchCoding
from kproxy.testing.clock import FakeClock

POD = Kind("v1", "Pod", "PodList", protobuf=False)
CODINGS = ["gzip", "zstd"]


def obj(key: str, rv: int, filler: int = 0) -> CachedObject:
    namespace, _, name = key.rpartition("/")
    body = b'{"metadata":{"name":"' + name.encode() + b'","resourceVersion":"' + str(rv).encode() + b'"}}'
    return CachedObject(key, namespace, name, rv, {}, {"metadata.name": name}, json=body + b" " * filler)


class Frames:
    """Frames that say what they are, padded like a real object so that compression has work."""

    def event(self, type_: str, o: CachedObject, media_type: str) -> bytes:
        return f"{type_} {o.key} {o.rv} {'x' * 300};".encode()

    def bookmark(self, rv: int, media_type: str, *, initial_events_end: bool = False) -> bytes:
        return f"BOOKMARK {rv}{' end' if initial_events_end else ''};".encode()


class Decoder:
    """A client's decoder for a stream of several frames (members)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.obj: Any = None
        self.text = b""

    def feed(self, data: bytes) -> None:
        while data:
            if self.obj is None:
                self.obj = zstd.ZstdDecompressor() if self.coding == "zstd" else zlib.decompressobj(wbits=31)
            self.text += self.obj.decompress(data)
            if not self.obj.eof:
                return
            data, self.obj = self.obj.unused_data, None

    @property
    def at_frame_end(self) -> bool:
        return self.obj is None


class Sink(PlainSink):
    """A fake connection whose bytes are decoded as they come (``coding``), and that can fill up
    (``full``) and drain again any number of times."""

    def __init__(self, coding: str | None) -> None:
        super().__init__()
        self.decoder = Decoder(coding) if coding else None

    @property
    def full(self) -> bool:
        return not self._writable

    @full.setter
    def full(self, value: bool) -> None:
        self._writable = not value

    def write(self, data: bytes) -> None:
        assert not self.closed
        super().write(data)
        if self.decoder is not None:
            self.decoder.feed(data)
            # Every write is decodable at once: what came out so far ends with a whole event.
            assert self.decoder.text.endswith(b";"), self.decoder.text[-40:]

    def resume(self) -> None:
        super().resume()
        self.resumed = asyncio.Event()

    @property
    def text(self) -> bytes:
        return self.decoder.text if self.decoder is not None else b"".join(self.writes)


class Counting(WatchCoding):
    """A ``WatchCoding`` that counts the bytes it really compresses."""

    def __init__(self, coding: str) -> None:
        codec = zstd_codec(-1, 16, 11) if coding == "zstd" else gzip_codec(0)
        super().__init__(codec)
        self.compressed = 0

    def solo(self, data: bytes) -> bytes:
        self.compressed += len(data)
        return super().solo(data)

    def new_frame(self) -> CountedFrame:  # type: ignore[override]
        return CountedFrame(super().new_frame(), self)


class CountedFrame:
    def __init__(self, frame: SharedFrame, owner: Counting) -> None:
        self.frame, self.owner = frame, owner

    def compress(self, data: bytes) -> bytes:
        self.owner.compressed += len(data)
        return self.frame.compress(data)

    def end(self) -> bytes:
        return self.frame.end()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def cache() -> WatchCache:
    c = WatchCache(POD)
    c.replace([obj("ns/a", 3), obj("ns/b", 4)], 10)
    return c


@pytest.mark.parametrize("coding", CODINGS)
async def test_watchers_in_step_share_one_compression_of_each_event(cache: WatchCache, coding: str) -> None:
    clock = FakeClock()
    bc = Broadcaster(cache, Frames(), clock=clock)
    wc = Counting(coding)
    sinks = [Sink(coding) for _ in range(20)]
    for s in sinks:
        bc.watch_since(s, Selection(), "json", bookmarks=False, timeout=600, rv=10, coding=wc)
    plain = Sink(None)
    bc.watch_since(plain, Selection(), "json", bookmarks=False, timeout=600, rv=10)
    for rv in range(11, 41):
        cache.apply(MODIFIED, obj("ns/a", rv))
        await settle()
        clock.now += 0.01
    one_event = len(Frames().event(MODIFIED, obj("ns/a", 11), "json"))
    # Thirty events, compressed once each, not once per watcher.
    assert wc.compressed == pytest.approx(30 * one_event, rel=0.05)
    for s in sinks:
        assert s.text == plain.text
        assert s.writes[1] is sinks[0].writes[1]  # the same bytes object for every watcher
    assert len(plain.text.split(b";")) == 31
    await bc.stop()
    for s in sinks:  # each stream ends with a complete frame
        assert s.closed and s.decoder is not None and s.decoder.at_frame_end


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_watcher_with_a_bookmark_of_its_own_leaves_and_joins_the_next_frame(
    cache: WatchCache, coding: str
) -> None:
    clock = FakeClock()
    bc = Broadcaster(cache, Frames(), bookmark_interval=5, clock=clock)
    wc = Counting(coding)
    quiet, quiet2, marked = Sink(coding), Sink(coding), Sink(coding)
    for s in (quiet, quiet2):  # the larger set of watchers in step keeps the frame
        bc.watch_since(s, Selection(), "json", bookmarks=False, timeout=600, rv=10, coding=wc)
    w = bc.watch_since(marked, Selection(), "json", bookmarks=True, timeout=600, rv=10, coding=wc)
    cache.apply(MODIFIED, obj("ns/a", 11))
    await settle()
    assert w.stream is not None and quiet.writes == marked.writes
    clock.now += 5
    bc.tick()  # the bookmark is the marked watcher's alone
    cache.apply(MODIFIED, obj("ns/a", 12))
    await settle()
    assert w.stream is None and marked.decoder is not None and marked.decoder.at_frame_end
    clock.now += 0.1
    cache.apply(MODIFIED, obj("ns/a", 13))
    await settle()
    # The frame is over a second old: a new one starts, the others get the end of theirs first.
    assert w.stream is not None and quiet.writes[-1] is not marked.writes[-1]
    assert quiet.writes[-1].endswith(marked.writes[-1])
    quiet2.full = True  # its connection takes nothing for a while: it leaves
    clock.now += 0.1
    cache.apply(MODIFIED, obj("ns/a", 14))
    await settle()
    w2 = next(x for x in bc._watchers if x.sink is quiet2)
    assert w2.stream is None
    quiet2.resume()  # its backlog goes out as a frame of its own
    await settle()
    clock.now += 0.1
    cache.apply(MODIFIED, obj("ns/a", 15))
    await settle()
    # In step again, but the frame is too young to start anew: still a frame of its own.
    assert w2.stream is None and quiet.writes[-1] is marked.writes[-1]
    clock.now += RESTART_AFTER
    cache.apply(MODIFIED, obj("ns/a", 16))
    await settle()
    assert w2.stream is not None and w.stream is not None
    cache.apply(MODIFIED, obj("ns/a", 17))
    await settle()
    assert quiet.writes[-1] is marked.writes[-1] is quiet2.writes[-1]
    events = [f"MODIFIED ns/a {rv} {'x' * 300}" for rv in range(11, 18)]
    assert marked.text.decode().split(";")[:-1] == [events[0], "BOOKMARK 11", *events[1:]]
    assert quiet.text.decode().split(";")[:-1] == events == quiet2.text.decode().split(";")[:-1]
    await bc.stop()


@pytest.mark.parametrize("coding", CODINGS)
async def test_compressed_streams_decode_to_what_uncompressed_twins_get(cache: WatchCache, coding: str) -> None:
    """Random watchers (initial events, resumes, bookmarks, three selections), connections that
    fill and drain, and closes, against an uncompressed twin of each registered at the same moment."""
    rnd = random.Random(f"shared-{coding}")
    clock = FakeClock()
    bc = Broadcaster(cache, Frames(), bookmark_interval=3, clock=clock, buffer=1000)
    wc = Counting(coding)
    pairs: list[tuple[list[Watcher], Sink, Sink]] = []
    selections = [Selection(), Selection("ns", None, ("ns", "", "")), Selection("other", None, ("other", "", ""))]

    def open_pair() -> None:
        bookmarks = rnd.random() < 0.5
        timeout = 600.0
        sel = rnd.choice(selections)
        sinks = Sink(coding), Sink(None)
        ws = []
        if rnd.random() < 0.3:
            for s, c in zip(sinks, (wc, None), strict=True):
                ws.append(
                    bc.watch_initial(
                        s, sel, "json", bookmarks=bookmarks, initial_events_end=True, timeout=timeout, coding=c
                    )
                )
        else:
            rv = cache.rv - rnd.randint(0, 5)
            for s, c in zip(sinks, (wc, None), strict=True):
                ws.append(bc.watch_since(s, sel, "json", bookmarks=bookmarks, timeout=timeout, rv=rv, coding=c))
        pairs.append((ws, *sinks))

    for _ in range(8):
        open_pair()
    rv = cache.rv
    for step in range(400):
        r = rnd.random()
        if r < 0.05:
            open_pair()
        elif r < 0.1 and pairs:
            _, a, b = rnd.choice(pairs)
            a.full = b.full = True
        elif r < 0.2:
            for _, a, b in pairs:
                if a.full:
                    a.resume()
                    b.resume()
        elif r < 0.22 and pairs:
            ws, *_ = rnd.choice(pairs)
            for w in ws:
                bc.close(w)
        for _ in range(rnd.randint(1, 3)):
            rv += 1
            cache.apply(MODIFIED, obj(rnd.choice(["ns/a", "ns/b", "other/c"]), rv))
        clock.now += rnd.choice([0.05, 0.3, 1.1])
        if step % 7 == 0:
            bc.tick()
        await settle()
    for _, a, b in pairs:
        if a.full:
            a.resume()
            b.resume()
    await settle()
    await bc.stop()
    assert len(pairs) > 12
    for _, a, b in pairs:
        assert a.text == b.text
        assert a.decoder is not None and a.decoder.at_frame_end
    # Sharing happened: far fewer bytes compressed than delivered.
    delivered = sum(len(b.text) for _, _, b in pairs)
    assert wc.compressed < delivered / 2


async def test_a_frame_ended_for_one_reader_still_decodes_for_the_others(cache: WatchCache) -> None:
    """gzip: the trailer a leaving reader gets carries the CRC and size of what it received."""
    coding = WatchCoding(gzip_codec(1))
    frame = coding.new_frame()
    a = frame.compress(b"one;")
    end_a = frame.end()
    b = frame.compress(b"two;")
    end_b = frame.end()
    assert zlib.decompress(a + end_a, wbits=31) == b"one;"
    assert zlib.decompress(a + b + end_b, wbits=31) == b"one;two;"
    with pytest.raises(zlib.error):
        zlib.decompress(a + b + end_a, wbits=31)  # the CRC is checked
