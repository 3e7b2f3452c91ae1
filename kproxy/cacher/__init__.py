"""The watch-cache engine: Reflector, WatchCache (store + event history), snapshots, selectors.

No HTTP here (the ``watchcache`` filter adapts it): a Reflector fills a WatchCache through a
``ListerWatcher`` it is given, and readers take consistent ``Snapshot``\\ s of it.

Owns: ``reflector``, ``watch_cache``, ``history``, ``broadcaster`` and ``shared_stream`` (watch
fan-out), ``listing``, ``continue_token``, ``resource_version``, ``objects`` and ``ingest`` (from
upstream bytes to CachedObjects), ``labels``, ``fields`` and ``selector_errors`` (label and field
selectors, as apimachinery parses them), ``time_budget``, ``persist`` (the cache on disk).

May import: ``kproxy.gocompat``, ``kproxy.codec``, ``kproxy.compress``, ``kproxy.gctuning``, ``cryptography``
(persist's AES-GCM). No
aiohttp, no filter, no server, no identity.
"""

from .continue_token import ContinueToken, decode_continue, encode_continue
from .history import ADDED, DELETED, MODIFIED, CacheEvent, EventHistory
from .listing import Page, select
from .objects import CachedObject, Kind, object_key
from .reflector import (
    BOOKMARK,
    Expired,
    ListerWatcher,
    ListPage,
    NotResumed,
    NotServed,
    Reflector,
    StreamingListUnsupported,
    TooLarge,
    UpstreamEvent,
)
from .watch_cache import Snapshot, WatchCache

__all__ = [
    "ADDED",
    "BOOKMARK",
    "DELETED",
    "MODIFIED",
    "CacheEvent",
    "CachedObject",
    "ContinueToken",
    "EventHistory",
    "Expired",
    "Kind",
    "ListPage",
    "ListerWatcher",
    "NotResumed",
    "NotServed",
    "Page",
    "Reflector",
    "Snapshot",
    "StreamingListUnsupported",
    "TooLarge",
    "UpstreamEvent",
    "WatchCache",
    "decode_continue",
    "encode_continue",
    "object_key",
    "select",
]
