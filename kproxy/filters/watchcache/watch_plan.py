"""Which watches the cache serves, decided from the request alone (``plan.py`` is the same for reads).

Options are read and validated as the apiserver does (``get.go`` ``ListResource``,
``internalversion/defaults.go``, ``internalversion/validation/validation.go``): anything it would
refuse, and anything the cache cannot serve exactly, passes through untouched, so the apiserver's
own answer reaches the client.

What a served watch starts with (1.34+ with WatchList; staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go):

* ``sendInitialEvents=true`` (also what resourceVersion "" and "0" default to): the state as
  ADDED events, then the initial-events-end bookmark when bookmarks are allowed, then live events;
  the state is any (``0``), consistent (unset: the upstream's current resource version first) or
  at least N.
* ``sendInitialEvents=false``: no initial events; from the current resource version ("" is
  consistent, "0" any) or after N.
* resourceVersion N (no sendInitialEvents): every event after N from the history (410 in an ERROR
  event when the history no longer reaches back to N).
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.cacher.fields import FieldSelector, SelectableFields, escape_value
from kproxy.cacher.labels import LabelSelector
from kproxy.core.chain import Exchange
from kproxy.core.negotiation import JSON, PROTOBUF, SERVED, YAML, negotiate, router_accepts
from kproxy.core.requestinfo import param_bool
from kproxy.identity.authn import is_websocket_request

from .partial import partial_media, wants_partial
from .plan import RV_TEXT, Pass, common_scope, exact_match, go_int64, parse_selectors

_WATCH_PARAMS = frozenset(
    {
        "watch",
        "resourceVersion",
        "resourceVersionMatch",
        "allowWatchBookmarks",
        "sendInitialEvents",
        "timeoutSeconds",
        "labelSelector",
        "fieldSelector",
        "timeout",  # ignored for watches (get.go): only timeoutSeconds counts
        "pretty",  # watch frames are never pretty-printed
    }
)


@dataclass(slots=True)
class WatchRead:
    """A watch the cache serves."""

    namespace: str
    initial: bool  # starts with the state as ADDED events
    consistency: str  # any | consistent | min (at least ``rv``) | since (events after ``rv``)
    rv: int
    bookmarks: bool
    initial_events_end: bool
    timeout_seconds: float  # 0: the apiserver's randomised default
    labels: LabelSelector | None
    fields: FieldSelector | None
    label_text: str
    field_text: str
    media_type: str
    gzip: bool = False  # a watch-list stream for a client offering gzip (1.37 WatchListCompression)

    @property
    def mode(self) -> str:
        """For metrics: how it starts."""
        return ("initial-" if self.initial else "") + self.consistency


def _media(ex: Exchange, protobuf: bool) -> str | Pass:
    """``NegotiateOutputMediaType`` (406 and conversions other than metadata-only pass through), then the stream
    serializer (``NegotiateOutputMediaTypeStream``: YAML has none)."""
    accept = ex.headers.get("Accept")
    if not router_accepts(accept):
        return Pass("media type")
    served = SERVED if protobuf else (JSON, YAML)
    chosen = negotiate(accept, served)
    if chosen is None:
        return Pass("media type")
    # The transform comes from that choice, the encoding from the stream serializer's (watch.go
    # serveWatchHandler): a metadata-only watch of a built-in kind in JSON or protobuf.
    partial = wants_partial(chosen, "PartialObjectMetadata")
    if partial is None or (partial and not protobuf):
        return Pass("media type")
    streamed = negotiate(accept, (JSON, PROTOBUF) if protobuf else (JSON,))
    if streamed is None or (streamed.convert is not None and not partial):
        return Pass("media type")
    return partial_media(streamed.media_type) if partial else streamed.media_type


#: The minor from which the apiserver gzips watch-list streams (``WatchListCompression``, beta and on).
WATCH_LIST_GZIP_SINCE = 37


def plan_watch(
    ex: Exchange, *, protobuf: bool, selectable: SelectableFields, namespaced: bool, list_gzip: bool = True
) -> WatchRead | Pass:
    info = ex.info
    q = ex.query
    if ex.upgrade and is_websocket_request(ex.headers):
        # A WebSocket watch (one event per message) is the apiserver's (handlers/watch.go
        # serveWatchHandler, wsstream.IsWebSocketRequest); another Upgrade it serves as any watch.
        return Pass("websocket")
    scope = common_scope(ex, namespaced)
    if isinstance(scope, Pass):
        return scope
    if set(q) - _WATCH_PARAMS:
        return Pass("parameters")
    rv = q.get("resourceVersion", "")
    match = q.get("resourceVersionMatch", "")
    if rv and not RV_TEXT.fullmatch(rv):
        return Pass("invalid")
    send_initial = param_bool(q["sendInitialEvents"]) if "sendInitialEvents" in q else None
    bookmarks = param_bool(q["allowWatchBookmarks"]) if "allowWatchBookmarks" in q else False
    if send_initial is None and not match and rv in ("", "0"):
        send_initial, match = True, "NotOlderThan"  # the WatchList defaulting
    if send_initial is not None and match != "NotOlderThan":
        return Pass("invalid")
    if send_initial is None and match:
        return Pass("invalid")
    timeout_seconds = 0.0
    if "timeoutSeconds" in q:
        given = go_int64(q["timeoutSeconds"])
        if given is None:
            return Pass("invalid")
        timeout_seconds = _go_timeout(given)
        if timeout_seconds < 0:
            return Pass("timeout")  # a watch that ends at once, as the apiserver's does
    label_text = q.get("labelSelector", "")
    field_text = q.get("fieldSelector", "")
    selectors = parse_selectors(label_text, field_text, selectable)
    if isinstance(selectors, Pass):
        return selectors
    labels, fields = selectors
    if info.name and len(info.parts) > 1:
        # A watch of one object named in the path (get.go ListResource; a name the request info
        # took from the field selector is that selector's own): a field selector of its own must
        # require metadata.name to be that name (else the apiserver's 400 "fieldSelector
        # metadata.name doesn't match requested name"); without one, that term is the selector.
        if fields is not None:
            if exact_match(fields, "metadata.name") != info.name:
                return Pass("invalid")
        else:
            field_text = f"metadata.name={escape_value(info.name)}"
            selectors = parse_selectors(label_text, field_text, selectable)
            if isinstance(selectors, Pass):
                return selectors
            labels, fields = selectors
    media = _media(ex, protobuf)
    if isinstance(media, Pass):
        return media
    n = int(rv) if rv else 0
    # handlers/watch.go: watch-list streams (sendInitialEvents and bookmarks, after defaulting)
    # are gzipped, one member per flush, when the first Accept-Encoding line has the exact token;
    # from 1.37 (``list_gzip``: the upstream's minor has it).
    gzip = list_gzip and bool(send_initial) and bookmarks and _offers_gzip(ex.headers.get("Accept-Encoding", ""))
    if send_initial:
        consistency = "consistent" if rv == "" else "any" if rv == "0" else "min"
        initial = True
    elif send_initial is False and rv in ("", "0"):
        consistency = "consistent" if rv == "" else "any"
        initial = False
    else:
        consistency, initial = "since", False
    return WatchRead(
        scope,
        initial,
        consistency,
        n,
        bookmarks,
        bool(send_initial) and bookmarks,
        timeout_seconds,
        labels,
        fields,
        label_text,
        field_text,
        media,
        gzip,
    )


def _go_timeout(seconds: int) -> float:
    """``time.Duration(timeoutSeconds) * time.Second`` as Go computes it: int64 nanoseconds that
    wrap around (a huge timeoutSeconds can come out short, or negative: a watch that ends at once);
    0 is the randomised default."""
    ns = (seconds * 1_000_000_000 + (1 << 63)) % (1 << 64) - (1 << 63)
    return ns / 1e9


def _offers_gzip(first_line: str) -> bool:
    """``responsewriters/compression.go``: comma-separated, trimmed, exactly ``gzip``."""
    return any(t.strip() == "gzip" for t in first_line.split(",")) if first_line else False
