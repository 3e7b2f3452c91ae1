"""How a reload swaps the chain of a real server (in process, in front of the real apiserver):
unchanged filters keep their running instance, a replaced filter is stopped only once the requests
it holds have finished, and a filter that fails to start leaves the running chain in place."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import aiohttp
import pytest
from pydantic import BaseModel, ConfigDict

import kproxy.filters
from kproxy.config import Config, parse_config
from kproxy.core.chain import Exchange, FilterBase, Handler, Reply
from kproxy.core.context import FilterContext
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.proxy import ProxyServer

EVENTS: list[str] = []
RELEASE = asyncio.Event()


class TagSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tag: str
    fail_start: bool = False


class Tagging(FilterBase):
    """Adds ``X-Tag-<name>: <tag>`` to replies; ``/version?hold`` waits for RELEASE."""

    name: ClassVar[str] = ""
    config_model: ClassVar[type[BaseModel]] = TagSettings

    def __init__(self, settings: TagSettings) -> None:
        self.settings = settings

    async def start(self, ctx: FilterContext) -> None:
        if self.settings.fail_start:
            raise RuntimeError("cannot start")
        EVENTS.append(f"start {self.name}={self.settings.tag}")
        await super().start(ctx)

    async def stop(self) -> None:
        EVENTS.append(f"stop {self.name}={self.settings.tag}")

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        if ex.raw_query == "hold":
            await RELEASE.wait()
        reply = await call_next(ex)
        reply.headers[f"X-Tag-{self.name}"] = self.settings.tag
        return reply


class Keep(Tagging):
    name: ClassVar[str] = "keep"


class Swap(Tagging):
    name: ClassVar[str] = "swap"


def _config(keep: str, swap: str, fail: bool = False) -> Config:
    return parse_config(
        {
            "listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "filters": [{"name": "keep", "tag": keep}, {"name": "swap", "tag": swap, "fail_start": fail}],
        }
    )


async def test_reload_reuses_unchanged_filters_and_drains_replaced_ones(
    control_plane: ControlPlaneInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    classes: dict[str, Any] = {"keep": Keep, "swap": Swap}
    monkeypatch.setattr(kproxy.filters, "lookup", classes.__getitem__)
    EVENTS.clear()
    RELEASE.clear()
    cfg = _config("k1", "s1")
    server = ProxyServer(
        cfg, from_kubeconfig(str(control_plane.admin_kubeconfig), None), kproxy.filters.build_filters(cfg)
    )
    await server.start()
    assert server.bound is not None
    base = f"http://{server.bound[0]}:{server.bound[1]}/version"
    try:
        async with aiohttp.ClientSession() as http:
            held = asyncio.create_task(http.get(base + "?hold"))
            while server.chain.active == 0:  # the held request is inside the chain
                await asyncio.sleep(0.01)
            kept = server.chain.filters[0]

            assert await server.apply_config(_config("k1", "s2")) == []
            assert server.chain.filters[0] is kept
            async with http.get(base) as resp:
                assert (resp.headers["X-Tag-keep"], resp.headers["X-Tag-swap"]) == ("k1", "s2")
            # The old swap filter still holds a request: not stopped yet.
            assert EVENTS == ["start keep=k1", "start swap=s1", "start swap=s2"]
            RELEASE.set()
            async with await held as resp:
                assert resp.status == 200
                assert resp.headers["X-Tag-swap"] == "s1"  # finished on the chain it started on
            for _ in range(100):
                if "stop swap=s1" in EVENTS:
                    break
                await asyncio.sleep(0.01)
            assert EVENTS[-1] == "stop swap=s1"

            # A filter that cannot start: the reload fails and the running chain stays.
            running = server.chain
            with pytest.raises(RuntimeError, match="cannot start"):
                await server.apply_config(_config("k2", "s3", fail=True))
            assert server.chain is running
            # k2 had started before s3 failed; it is stopped again, and k1 keeps running.
            assert EVENTS[-2:] == ["start keep=k2", "stop keep=k2"]
            async with http.get(base) as resp:
                assert (resp.headers["X-Tag-keep"], resp.headers["X-Tag-swap"]) == ("k1", "s2")
    finally:
        await server.shutdown(1.0)
    assert EVENTS[-2:] == ["stop swap=s2", "stop keep=k1"]


async def test_a_filter_shared_with_a_draining_chain_outlives_a_second_reload(
    control_plane: ControlPlaneInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reload twice while a request holds the first chain: the filter it shares with the second
    chain is stopped only when that request ends, not when the second chain is replaced."""
    classes: dict[str, Any] = {"keep": Keep, "swap": Swap}
    monkeypatch.setattr(kproxy.filters, "lookup", classes.__getitem__)
    EVENTS.clear()
    RELEASE.clear()
    cfg = _config("k1", "s1")
    target = from_kubeconfig(str(control_plane.admin_kubeconfig), None)
    server = ProxyServer(cfg, target, kproxy.filters.build_filters(cfg))
    await server.start()
    assert server.bound is not None
    base = f"http://{server.bound[0]}:{server.bound[1]}/version"
    try:
        async with aiohttp.ClientSession() as http:
            held = asyncio.create_task(http.get(base + "?hold"))
            while server.chain.active == 0:
                await asyncio.sleep(0.01)
            await server.apply_config(_config("k1", "s2"))  # keep=k1 shared with the held chain
            await server.apply_config(_config("k2", "s2"))  # the second chain drains at once
            assert "stop keep=k1" not in EVENTS  # still used by the held request's chain
            RELEASE.set()
            async with await held as resp:
                assert resp.headers["X-Tag-keep"] == "k1"
            for _ in range(100):
                if "stop keep=k1" in EVENTS:
                    break
                await asyncio.sleep(0.01)
            assert {"stop keep=k1", "stop swap=s1"} <= set(EVENTS)
            assert "stop swap=s2" not in EVENTS  # s2 is in the current chain
    finally:
        await server.shutdown(1.0)


async def test_reload_that_changes_a_builtin_filters_settings(control_plane: ControlPlaneInfo) -> None:
    """Changing a built-in filter's settings replaces its instance: the new one must start next to
    the old (metrics registered once per registry), and what they share (the validation filter's
    schema cache and its CRD watch) must outlive the old instance."""
    filters_a = [
        {"name": "compression"},
        {"name": "dryrun", "rules": [{"match": {"namespaces": ["a"]}, "action": "enforce"}]},
        {"name": "validation", "access_ttl": 10},
        {"name": "transcode"},
    ]
    filters_b = [
        {"name": "compression", "min_size": 2048},
        {"name": "dryrun", "rules": [{"match": {"namespaces": ["b"]}, "action": "enforce"}]},
        {"name": "validation", "access_ttl": 20},
        {"name": "transcode", "upstream": "auto"},
    ]

    def cfg(filters: list[dict[str, Any]]) -> Config:
        return parse_config({"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "filters": filters})

    first = cfg(filters_a)
    target = from_kubeconfig(str(control_plane.admin_kubeconfig), None)
    server = ProxyServer(first, target, kproxy.filters.build_filters(first))
    await server.start()
    try:
        old = {f.name: f for f in server.chain.filters}
        assert await server.apply_config(cfg(filters_b)) == []
        new = {f.name: f for f in server.chain.filters}
        assert all(new[name] is not old[name] for name in new)  # every entry changed: new instances
        old_v, new_v = old["validation"], new["validation"]
        assert new_v.cache is old_v.cache  # type: ignore[attr-defined]
        # The old instance is stopped (no request held it); the process's one CRD list+watch
        # (ctx.discovery) still runs and feeds the new one, and ends with the server.
        schemas = new_v._schemas  # type: ignore[attr-defined]
        assert old_v._schemas is None and schemas.users == 1  # type: ignore[attr-defined]
        feed = new_v.ctx.discovery.crd_feed  # type: ignore[attr-defined]
        assert feed is not None and feed.reflector.running
        assert schemas.cache._crds is feed
    finally:
        await server.shutdown(1.0)
    assert not feed.reflector.running
