"""The watch-cache engine: Reflector, WatchCache (store + event history), snapshots, selectors.

No HTTP here (the ``watchcache`` filter adapts it): a Reflector fills a WatchCache through a
``ListerWatcher`` it is given, and readers take consistent ``Snapshot``\\ s of it.
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
    NotServed,
    Reflector,
    StreamingListUnsupported,
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
    "NotServed",
    "Page",
    "Reflector",
    "Snapshot",
    "StreamingListUnsupported",
    "UpstreamEvent",
    "WatchCache",
    "decode_continue",
    "encode_continue",
    "object_key",
    "select",
]
