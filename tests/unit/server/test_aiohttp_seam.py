"""The HTTP/1.1 edge's seam into aiohttp (kproxy.server.listener.AIOHTTP_SEAM): every member of
aiohttp's classes outside its documented API that the edge uses or overrides is listed, and the
installed aiohttp has each. A release that moves one stops kproxy at start (not open), and this
test names what moved; docs/developing/architecture.md#the-aiohttp-seam says what to do then."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from aiohttp import web, web_protocol, web_request, web_runner, web_server

from kproxy.server import listener
from kproxy.server.listener import AIOHTTP_SEAM, GoRequestHandler, GoServer, seam_missing

SERVER = Path(listener.__file__).parent
EDGE = [SERVER / "listener.py", SERVER / "upgrade.py"]

# aiohttp classes whose internals the edge could touch.
AIOHTTP_CLASSES = [
    web_protocol.RequestHandler,
    web_server.Server,
    web_runner.BaseRunner,
    web_runner.AppRunner,
    web_request.BaseRequest,
    web.StreamResponse,
]

# Private names the edge's own classes define that an aiohttp class also happens to have.
OWN = {
    "_protocol": "_HeadLimit._protocol: the GoRequestHandler it reports to",
    "_raw": "_RawAnswer._raw and GoRequestHandler._raw: kproxy's own bytes and transport",
    "_body": "_HeadLimit._body: the body of the last request whose head it parsed",
    "_head": "_HeadLimit._head: the bytes received since that head",
}


def _in_aiohttp(name: str) -> bool:
    for cls in AIOHTTP_CLASSES:
        if hasattr(cls, name):
            return True
        try:
            if f"self.{name}" in inspect.getsource(cls.__init__):
                return True
        except (OSError, TypeError):
            continue
    return False


def _private_names(path: Path) -> set[str]:
    """Private attributes read or written, and private methods defined, in ``path``."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
            names.update([node.name] if not node.name.startswith("__") else [])
    return names


def test_the_installed_aiohttp_has_every_member_of_the_seam() -> None:
    assert seam_missing() == []


def test_the_seam_lists_every_aiohttp_internal_the_edge_uses() -> None:
    listed = {name for names in AIOHTTP_SEAM.values() for name in names}
    used = set().union(*(_private_names(p) for p in EDGE))
    unlisted = sorted(n for n in used if _in_aiohttp(n) and n not in listed and n not in OWN)
    assert unlisted == [], f"aiohttp internals used by the edge but not in AIOHTTP_SEAM: {unlisted}"
    # and nothing listed that the edge no longer uses
    assert sorted(listed - used - {"set_parser"}) == []
    assert "set_parser" in (SERVER / "upgrade.py").read_text()


def test_a_missing_member_stops_the_server_from_being_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly, not open: a GoServer is not made on an aiohttp without the seam."""
    monkeypatch.setattr(listener, "_SEAM_CHECKED", False)
    monkeypatch.setitem(AIOHTTP_SEAM, web_protocol.RequestHandler, ("_parser", "_not_in_any_aiohttp"))
    with pytest.raises(RuntimeError, match="_not_in_any_aiohttp"):
        GoServer(lambda request: None)
    assert issubclass(GoRequestHandler, web_protocol.RequestHandler)
