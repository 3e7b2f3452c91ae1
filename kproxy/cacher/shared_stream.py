"""One compressed stream shared by the watchers of a selection (see ``kproxy.compress.shared``).

The broadcaster gives the same frames to every watcher of a group in a loop pass. When those
watchers also ask for the same content coding, the ones that have received exactly the same
compressed bytes since the stream's current frame began (its *members*) share one compressor:
the pass's frames are compressed once and the output written to each of them.

Per pass, the set of watchers with the same frames that holds the most members (then: the
largest) takes the shared output; when members are idle and none is in it, nobody does. A member
that does not take it (it got a bookmark of its own, its connection was full, ...) leaves: its
copy of the frame is ended, and it gets complete frames of its own until the stream starts a new
frame. The stream starts one when watchers wait to join and the frame is ``RESTART_AFTER``
seconds old (or has no members left): the members get the end of the old frame first. A new
frame forgets the compressor's history, so it is started at most that often.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from kproxy.compress.stream import cpu_timed

#: Seconds a shared frame lasts at least before watchers waiting to join make it start anew.
RESTART_AFTER = 1.0


class Frame(Protocol):
    def compress(self, data: bytes) -> bytes:
        """``data`` compressed and flushed: decodable at once."""

    def end(self) -> bytes:
        """What ends the frame for a reader that has all of it so far."""


class Coding(Protocol):
    """A content coding for watch streams (``kproxy.compress.shared.WatchCoding``)."""

    name: str
    #: Whether watchers may share frames; if not, every write is one complete frame.
    shared: bool
    #: Called with (bytes in, bytes out, CPU seconds) for every codec call.
    account: Callable[[int, int, float], None]

    def solo(self, data: bytes) -> bytes:
        """``data`` as one complete frame."""

    def new_frame(self) -> Frame: ...


class _Writer(Protocol):
    def write(self, data: bytes) -> Any: ...


class Member(Protocol):
    """A watcher as a shared stream sees it (``kproxy.cacher.broadcaster.Watcher`` is one)."""

    pending: list[bytes]
    overfull_at: float | None
    stream: SharedStream[Any] | None

    @property
    def sink(self) -> _Writer: ...


W = TypeVar("W", bound=Member)


class SharedStream(Generic[W]):
    __slots__ = ("coding", "frame", "members", "started")

    def __init__(self, coding: Coding) -> None:
        self.coding = coding
        self.frame: Frame | None = None
        self.members: dict[W, None] = {}
        self.started = 0.0

    def leave(self, w: W) -> None:
        """``w`` stops following the stream: its copy of the frame ends here."""
        frame = self.frame
        assert frame is not None and w.stream is self
        self.members.pop(w, None)
        w.stream = None
        w.sink.write(frame.end())

    def send(self, ws: list[W], now: float) -> list[W]:
        """One loop pass for the watchers of this stream that have frames to write (each of them
        writable). The set with the same frames that holds the most members (then: the largest)
        is sent the shared output, unless members are idle this pass and none of them is in it;
        the others are returned, to be written one complete frame each."""
        best: list[Any] | None = None  # [frames, watchers, members among them]
        buckets: dict[tuple[int, int], list[list[Any]]] = {}
        for w in ws:
            frames = w.pending
            entries = buckets.setdefault((id(frames[0]), len(frames)), [])
            for entry in entries:
                if entry[0] == frames:  # list ==: identity first, so cheap for shared frames
                    entry[1].append(w)
                    break
            else:
                entry = [frames, [w], 0]
                entries.append(entry)
            if w.stream is self:
                entry[2] += 1
            if best is None or (entry[2], len(entry[1])) > (best[2], len(best[1])):
                best = entry
        assert best is not None
        frames, takers, in_step_count = best
        old = self.members
        if not in_step_count and old:
            return ws  # the members have nothing this pass: the stream stays where it is
        rest = [w for w in ws if w.pending is not frames and w.pending != frames] if len(takers) < len(ws) else []
        in_step, joining = [], []
        for w in takers:
            if w.stream is self:
                in_step.append(w)
                del old[w]
            else:
                joining.append(w)
        for w in list(old):  # members that do not take this pass's frames
            self.leave(w)
        end, ended = b"", []
        if joining:
            if self.frame is None or not in_step or now - self.started >= RESTART_AFTER:
                if in_step:
                    assert self.frame is not None
                    end, ended, in_step = self.frame.end(), in_step, []
                self.frame = self.coding.new_frame()
                self.started = now
            else:
                rest.extend(joining)  # they join when the next frame starts
                joining = []
        frame = self.frame
        assert frame is not None
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        out, seconds = cpu_timed(frame.compress, data)
        members: dict[W, None] = {}
        for w in in_step:
            w.sink.write(out)
        if ended:
            both = end + out
            for w in ended:
                w.sink.write(both)
        for w in joining:
            w.sink.write(out)
        for group in (in_step, ended, joining):
            for w in group:
                w.pending = []
                w.overfull_at = None
                w.stream = self
                members[w] = None
        self.members = members
        n = len(members)
        self.coding.account(len(data) * n, len(out) * n + len(end) * len(ended), seconds)
        return rest
