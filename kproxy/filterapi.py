"""The public filter API: everything a filter written outside kproxy imports, from here only.

A filter is a class registered in the ``kproxy.filters`` entry-point group (``examples/readonly-filter``
is a complete one; docs/using/writing-filters.md describes the API)::

    from kproxy.filterapi import Exchange, FilterBase, Handler, Reply, forbidden

    class ReadOnly(FilterBase):
        name: ClassVar[str] = "readonly"           # its name in the config
        config_model: ClassVar[type[BaseModel]] = ReadOnlySettings

        def __init__(self, settings: ReadOnlySettings) -> None: ...

        async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
            if ex.info.is_mutating:
                return Reply.from_status(forbidden(...), ex)
            return await call_next(ex)

The names below are kept compatible across minor releases (CHANGELOG.md says when one changes);
the modules they come from (``kproxy.core.*``) are kproxy's own and may be reorganised.
"""

from __future__ import annotations

from kproxy.core.chain import (
    Body,
    BytesBody,
    Exchange,
    Filter,
    FilterBase,
    Handler,
    Identity,
    Readiness,
    Reply,
    ShowsSettings,
    Starts,
    Stops,
    StreamBody,
    UpgradeBody,
)
from kproxy.core.context import ApiClient, CredentialsMode, FilterContext, ServiceKey
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import (
    CauseType,
    StatusCause,
    StatusDetails,
    StatusError,
    StatusReason,
    bad_request,
    conflict,
    forbidden,
    forbidden_for_request,
    generic,
    internal_error,
    invalid,
    method_not_supported,
    not_found,
    service_unavailable,
    too_many_requests,
    unauthorized,
)
from kproxy.core.upstreamgzip import decode_reply

__all__ = [
    "ApiClient",
    "Body",
    "BytesBody",
    "CauseType",
    "CredentialsMode",
    "Exchange",
    "Filter",
    "FilterBase",
    "FilterContext",
    "Handler",
    "Identity",
    "Readiness",
    "Reply",
    "RequestInfo",
    "ServiceKey",
    "ShowsSettings",
    "Starts",
    "StatusCause",
    "StatusDetails",
    "StatusError",
    "StatusReason",
    "Stops",
    "StreamBody",
    "UpgradeBody",
    "bad_request",
    "conflict",
    "decode_reply",
    "forbidden",
    "forbidden_for_request",
    "generic",
    "internal_error",
    "invalid",
    "method_not_supported",
    "not_found",
    "service_unavailable",
    "too_many_requests",
    "unauthorized",
]
