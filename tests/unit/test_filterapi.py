"""The public filter API (kproxy.filterapi): declared, sufficient for the example filter, and its
optional hooks called only on filters that have them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar

from multidict import CIMultiDict

import kproxy.core.chain
import kproxy.filterapi as api
from kproxy.core.chain import Chain
from kproxy.filterapi import BytesBody, Exchange, FilterContext, Handler, Reply, ServiceKey
from kproxy.testing.exchange import make_exchange

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "readonly-filter" / "kproxy_readonly"


def test_every_public_name_is_declared_and_importable() -> None:
    assert sorted(api.__all__) == sorted(set(api.__all__))
    for name in api.__all__:
        assert getattr(api, name) is not None
    public = {n for n in vars(api) if not n.startswith("_") and n != "annotations"}
    assert public == set(api.__all__)  # nothing exported by accident
    assert set(kproxy.core.chain.__all__) >= {"Exchange", "Reply", "Filter", "Chain"}


def test_the_example_filter_imports_only_the_public_api() -> None:
    kproxy_imports: list[str] = []
    for path in EXAMPLE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kproxy"):
                kproxy_imports.append(node.module)
                assert {a.name for a in node.names} <= set(api.__all__)
            elif isinstance(node, ast.Import):
                kproxy_imports += [a.name for a in node.names if a.name.startswith("kproxy")]
    assert kproxy_imports and set(kproxy_imports) == {"kproxy.filterapi"}


class Bare:
    """A filter with none of the optional hooks (not a FilterBase)."""

    name: ClassVar[str] = "bare"

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        return await call_next(ex)


class Hooked(Bare):
    name: ClassVar[str] = "hooked"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self, ctx: FilterContext) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")

    def ready(self) -> bool:
        return False


async def test_optional_hooks_are_called_on_the_filters_that_have_them() -> None:
    async def upstream(ex: Exchange) -> Reply:
        return Reply(200, CIMultiDict(), BytesBody(b"ok"))

    bare, hooked = Bare(), Hooked()
    assert not isinstance(bare, api.Starts | api.Stops | api.Readiness)
    assert isinstance(hooked, api.Starts) and isinstance(hooked, api.Stops) and isinstance(hooked, api.Readiness)
    chain = Chain([bare, hooked], upstream)
    await chain.start(None)  # type: ignore[arg-type]  # no filter here reads the context
    assert (await chain.handle(make_exchange())).status == 200
    assert chain.not_ready() == ["hooked"]
    await chain.stop()
    assert hooked.calls == ["start", "stop"]


def test_a_service_key_types_what_the_context_shares() -> None:
    ctx = FilterContext(None, "proxy", None)  # type: ignore[arg-type]
    key: ServiceKey[list[int]] = ServiceKey("tests.numbers")
    made = ctx.service(key, lambda: [1])
    assert ctx.service(key, lambda: [2]) is made  # made once
    assert ctx.service(ServiceKey[list[int]]("tests.numbers"), list) is made  # one name, one service
    assert ctx.find(ServiceKey[int]("tests.other")) is None
    ctx.provide(ServiceKey[int]("tests.other"), 3)
    assert ctx.find(ServiceKey[int]("tests.other")) == 3
