"""Frames that cost kproxy work and serve no request, metered before h2 parses them.

Go's server answers every PING and SETTINGS frame and closes a connection only once more than
10,000 of its control frames wait to be written (a client that does not read them: http2
server.go ``maxQueuedControlFrames``). Go spends about a microsecond on each; Python's h2 ten to
fifty, so a client that floods PINGs, SETTINGS or PRIORITY frames (or empty DATA and CONTINUATION
frames) while reading its answers could hold kproxy's one event loop for seconds where Go's
goroutine costs a core a fraction of that. kproxy therefore lets each connection have
``BURST`` such frames at once and ``RATE`` a second after that (client-go sends one PING in 30
seconds of silence); past it the connection ends with GOAWAY ENHANCE_YOUR_CALM. The frame heads are
read here (nine bytes each), so a flood is stopped before h2 parses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: Frames a connection may send at once (Go's bound on queued control frames).
BURST = 10000
#: And per second after that.
RATE = 1000.0

_PREFACE = 24  # b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _PRIORITY, _SETTINGS, _PING, _CONTINUATION = 0x0, 0x1, 0x2, 0x4, 0x6, 0x9
_ACK, _END_STREAM = 0x1, 0x1
#: Frame types ``feed``'s quick pass leaves to the general one: those it may count.
_METERED = frozenset((_PING, _SETTINGS, _PRIORITY))
_EMPTY_METERED = frozenset((_DATA, _CONTINUATION, _HEADERS))


class FrameMeter:
    """Reads the frame heads of what a client sends; ``feed`` is False once it floods."""

    __slots__ = ("_clock", "_head", "_skip", "_stamp", "_tokens")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._skip = _PREFACE  # bytes still to pass over: the preface, then each frame's payload
        self._head = b""
        self._tokens = float(BURST)
        self._stamp = self._clock()

    def feed(self, data: bytes) -> bool:
        if not self._skip and not self._head and len(data) >= 9:
            # The common read: whole frames from a frame boundary, each costing nothing.
            pos, end = 0, len(data)
            while end - pos >= 9:
                kind = data[pos + 3]
                if kind in _METERED:
                    break
                length = int.from_bytes(data[pos : pos + 3], "big")
                if length == 0 and kind in _EMPTY_METERED:
                    break
                pos += 9 + length
            else:
                if pos == end:
                    return True
            # a frame that costs, or a partial one: the general path from the start
        view = memoryview(data)
        pos, end = 0, len(view)
        cost = 0
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            need = 9 - len(self._head)
            if end - pos < need:
                self._head += bytes(view[pos:end])
                break
            head = self._head + bytes(view[pos : pos + need]) if self._head else bytes(view[pos : pos + 9])
            pos += need
            self._head = b""
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            if kind in (_PING, _SETTINGS):
                cost += not flags & _ACK
            elif kind == _PRIORITY:
                cost += 1
            elif kind in (_DATA, _CONTINUATION, _HEADERS) and length == 0 and not flags & _END_STREAM:
                cost += kind != _HEADERS
            self._skip = length
        if not cost:
            return True
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._stamp) * RATE) - cost
        self._stamp = now
        return self._tokens >= 0
