"""A test upstream that replays apiserver answers recorded from the real one.

:class:`ReplayUpstream` is a plain-HTTP server on 127.0.0.1 (aiohttp's low-level server) that
answers each request with a recorded exchange (``tests/recorded/apiserver.jsonl.gz``, written by
``python -m kproxy.testing.record``): the status, headers and body chunks the real apiserver sent,
byte for byte. It keeps every request it received (``received``) so a test can check what kproxy
forwarded. A request is answered by the first recording that matches, in this order:

1. same method and target, same media type in ``Accept`` (parameters aside), same
   ``Impersonate-User``;
2. the same with the query ignored, watch for watch and list for list (``fallback=True``, the
   default; a reflector's LIST and watch carry versions no recording can know).

Anything else is a 404 with ``X-Replay-Miss: 1`` and is kept in ``misses``. With
``hold_watches=True`` a watch stays open after its recorded events until the client leaves (a
reflector then sees no end of stream), else it ends where the apiserver ended it.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from kproxy.gocompat.url import query_values
from kproxy.server.listener import GoServer

__all__ = ["DEFAULT_RECORDINGS", "Received", "Recorded", "ReplayUpstream", "load_recordings", "recording"]

DEFAULT_RECORDINGS = Path(__file__).resolve().parents[2] / "tests" / "recorded" / "apiserver.jsonl.gz"

#: Response headers aiohttp writes itself from the body.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


class _NoServer:
    """The apiserver sends no ``Server`` header; aiohttp would add one."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()  # type: ignore[misc]
        self.headers.popall("Server", None)  # type: ignore[attr-defined]


class _Response(_NoServer, web.Response):
    pass


class _StreamResponse(_NoServer, web.StreamResponse):
    pass


@dataclass(frozen=True)
class Recorded:
    """One exchange with the real apiserver."""

    method: str
    target: str
    request_headers: dict[str, str]
    status: int
    headers: list[tuple[str, str]]
    chunks: list[bytes]
    note: str = ""
    request_body: bytes = b""

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def is_watch(self) -> bool:
        return _is_watch(self.target.partition("?")[2])

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Received:
    """One request the replay upstream got."""

    method: str
    target: str
    headers: CIMultiDict[str]
    body: bytes
    answered_by: Recorded | None = None

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> dict[str, list[str]]:
        return query_values(self.target.partition("?")[2])


def load_recordings(path: Path = DEFAULT_RECORDINGS) -> list[Recorded]:
    """The recordings in ``path`` (read once per process; the list is a fresh copy)."""
    return list(_load(path))


@functools.lru_cache(maxsize=4)
def _load(path: Path) -> tuple[Recorded, ...]:
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            e = json.loads(line)
            out.append(
                Recorded(
                    method=e["method"],
                    target=e["target"],
                    request_headers=e["request_headers"],
                    status=e["status"],
                    headers=[(k, v) for k, v in e["headers"]],
                    chunks=[base64.b64decode(c) for c in e["chunks"]],
                    note=e.get("note", ""),
                    request_body=base64.b64decode(e.get("request_body", "")),
                )
            )
    return tuple(out)


def recording(target: str, accept: str = "application/json", method: str = "GET", *, watch: bool = False) -> Recorded:
    """The default recording of ``method target`` with ``accept`` (``watch``: the first recorded
    watch with ``accept``, whatever its target)."""
    for r in load_recordings():
        same = r.method == method and r.request_headers.get("Accept") == accept
        if same and ((watch and r.is_watch) or (not watch and r.target == target)):
            return r
    raise LookupError(f"no recording of {method} {target} ({accept})")


def _is_watch(raw_query: str) -> bool:
    values = query_values(raw_query).get("watch") or [""]
    return values[0].lower() in ("1", "true")


def _media(accept: str) -> str:
    return accept.split(",")[0].split(";")[0].strip().lower()


def _same_headers(rec: Recorded, headers: CIMultiDict[str]) -> bool:
    want = rec.request_headers
    if _media(want.get("Accept", "")) != _media(headers.get("Accept", "")):
        return False
    return want.get("Impersonate-User", "") == headers.get("Impersonate-User", "")


@dataclass
class ReplayUpstream:
    """Serve ``recordings`` on 127.0.0.1; ``url`` is set by :meth:`start`."""

    recordings: list[Recorded] = field(default_factory=lambda: load_recordings())
    fallback: bool = True
    hold_watches: bool = False
    received: list[Received] = field(default_factory=list)
    misses: list[Received] = field(default_factory=list)
    url: str = ""
    _runner: web.ServerRunner | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    def find(self, method: str, target: str, headers: CIMultiDict[str]) -> Recorded | None:
        exact = [r for r in self.recordings if r.method == method and r.target == target]
        for r in exact:
            if _same_headers(r, headers):
                return r
        if not self.fallback:
            return None
        path, _, query = target.partition("?")
        watch = _is_watch(query)
        for r in self.recordings:
            if r.method == method and r.path == path and r.is_watch == watch and _same_headers(r, headers):
                return r
        return None

    def add(self, recordings: Iterable[Recorded], *, first: bool = True) -> None:
        """Add recordings (before the others unless ``first`` is False)."""
        new = list(recordings)
        self.recordings = [*new, *self.recordings] if first else [*self.recordings, *new]

    def requests(self, method: str | None = None, path: str | None = None) -> list[Received]:
        return [r for r in self.received if (method in (None, r.method)) and (path in (None, r.path))]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        got = Received(request.method, request.raw_path, CIMultiDict(request.headers), await request.read())
        self.received.append(got)
        rec = self.find(request.method, request.raw_path, got.headers)
        if rec is None:
            self.misses.append(got)
            return web.Response(status=404, text="no recording\n", headers={"X-Replay-Miss": "1"})
        got.answered_by = rec
        headers: CIMultiDict[str] = CIMultiDict((k, v) for k, v in rec.headers if k.lower() not in _FRAMING)
        if rec.header("Content-Length") and not (rec.is_watch and self.hold_watches):
            return _Response(status=rec.status, headers=headers, body=rec.body)
        resp = _StreamResponse(status=rec.status, headers=headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for chunk in rec.chunks:
            await resp.write(chunk)
        if rec.is_watch and self.hold_watches:
            await self._closing.wait()
        await resp.write_eof()
        return resp

    async def start(self) -> ReplayUpstream:
        # Read as the apiserver's Go server reads requests (kproxy's listener does the same).
        server = GoServer(self._handle, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ReplayUpstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
