"""Hot reload: a changed config file (or SIGHUP) swaps the filter chain without dropping anything.

The file is polled by content, not by mtime or inotify: a Kubernetes ConfigMap volume updates
by swapping a ``..data`` symlink, which neither shows reliably, and the kubelet only syncs the
volume every minute or so anyway, so a poll every couple of seconds costs nothing.

A reload validates the whole new config and builds every new filter before anything changes;
if any of that fails, the error is logged and the running config stays. Then:

- a filter whose entry (name and settings) is unchanged keeps its running instance, so its state
  (a watch cache, a schema cache) survives the reload;
- new filters are started; the new chain takes every request that starts from then on;
- the old chain keeps serving what it already holds (in-flight requests, open watches,
  exec sessions) and its filters that left the config are stopped when the last of those ends.

Settings that belong to the listener or the upstream connection (listen addresses, TLS,
credentials mode, upstream) take effect only on restart; a reload that changes them says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import orjson

from kproxy import gctuning
from kproxy.config import Config, ConfigError, FilterEntry
from kproxy.core.chain import Chain, Filter
from kproxy.filters import build_filter
from kproxy.server.metrics import Metrics
from kproxy.server.upstream import Upstream

log = logging.getLogger("kproxy.reload")

#: Config keys a running server cannot change; a reload that changes them is applied without them.
RESTART_KEYS = (
    "listen",
    "admin_listen",
    "admin_tls",
    "allow_remote",
    "credentials",
    "upstream",
    "tls",
    "http2",
    "log.format",
)


class ReloadableServer(Protocol):
    """What a reload needs of the server (``kproxy.server.proxy.ProxyServer`` is one)."""

    cfg: Config
    chain: Chain
    upstream: Upstream
    metrics: Metrics

    async def apply_config(self, cfg: Config) -> list[str]: ...


def entry_key(entry: FilterEntry) -> bytes:
    """Identity of a filter entry: its name and settings, order-independent."""
    return orjson.dumps([entry.name, entry.settings], option=orjson.OPT_SORT_KEYS, default=str)


def restart_changes(old: Config, new: Config) -> list[str]:
    """The restart-only keys whose value differs between two configs."""
    out = []
    for key in RESTART_KEYS:
        a: object = old
        b: object = new
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        if a != b:
            out.append(key)
    return out


def build_chain(server: ReloadableServer, cfg: Config) -> tuple[Chain, list[Filter]]:
    """The chain for ``cfg``, reusing the running instance of every unchanged filter entry.

    Returns the chain and the filters in it that are new (to be started). Raises ConfigError
    (naming the key) before anything has been started."""
    running = {entry_key(e): f for e, f in zip(server.cfg.filters, server.chain.filters, strict=True)}
    filters: list[Filter] = []
    fresh: list[Filter] = []
    for i, entry in enumerate(cfg.filters):
        flt = running.pop(entry_key(entry), None)
        if flt is None:
            flt = build_filter(i, entry)
            fresh.append(flt)
        filters.append(flt)
    return Chain(filters, server.upstream, observe=server.metrics.observe_filter), fresh


class Reloader:
    """Reloads ``load()`` when the file at ``path`` changes (polled) or when asked (SIGHUP)."""

    def __init__(
        self, server: ReloadableServer, load: Callable[[], Config], path: str | Path | None, interval: float
    ) -> None:
        self.server = server
        self._load = load
        self.path = Path(path) if path else None
        self.interval = interval
        self._lock = asyncio.Lock()
        self._seen = self._fingerprint()
        self._task: asyncio.Task[None] | None = None

    def _fingerprint(self) -> bytes | None:
        if self.path is None:
            return None
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None  # mid-swap or gone: keep what runs, look again next time

    def start(self) -> None:
        if self.path is not None and self.interval > 0:
            self._task = asyncio.create_task(self._watch(), name="kproxy-config-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            seen = self._fingerprint()
            if seen is not None and seen != self._seen:
                await self.reload("config file changed")

    async def reload(self, trigger: str) -> bool:
        """Load, validate and apply the config; False (and the old config kept) on any error."""
        async with self._lock:
            self._seen = self._fingerprint()
            metrics = self.server.metrics
            try:
                cfg = self._load()
                ignored = await self.server.apply_config(cfg)
            except Exception as err:  # a bad config, or a filter that fails to start
                metrics.config_reloads.labels("failure").inc()
                log.error(
                    "config reload failed; the running config is kept",
                    extra={"trigger": trigger, "error": str(err)},
                    exc_info=not isinstance(err, ConfigError),
                )
                return False
            gctuning.thaw()  # the filters frozen at start-up may be garbage now (kproxy.gctuning)
            metrics.config_reloads.labels("success").inc()
            metrics.config_loaded.set(time.time())
            log.info(
                "config reloaded",
                extra={"trigger": trigger, "filters": [f.name for f in self.server.chain.filters]},
            )
            if ignored:
                log.warning(
                    "these settings change only on restart and were not applied",
                    extra={"keys": ignored, "trigger": trigger},
                )
            return True
