"""Status errors kproxy answers before any filter runs, written as the apiserver writes them
(``responsewriters.ErrorNegotiated``): in the media type the request's ``Accept`` negotiates with
the default endpoint restrictions (no ``as=`` conversions), pretty for ``?pretty`` or a human
client, and as indented JSON without a newline (``WriteRawJSON``) when nothing is acceptable.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from kproxy.core.chain import BytesBody, Reply
from kproxy.core.negotiation import JSON, PROTOBUF, SERVED, YAML, is_pretty, negotiate
from kproxy.core.status import StatusError
from kproxy.gocompat.jsonescape import go_json_dumps

if TYPE_CHECKING:
    from kproxy.codec import ProtobufCodec


@functools.cache
def _codec() -> ProtobufCodec:
    # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
    from kproxy.codec import ProtobufCodec

    return ProtobufCodec()


def negotiated_status(err: StatusError, headers: Mapping[str, str], query: Mapping[str, str]) -> Reply:
    """``err`` as the apiserver answers it to a request with these headers and query."""
    chosen = negotiate(headers.get("Accept"), SERVED, conversions=False)
    status = err.to_dict()
    if chosen is None:
        media, data = JSON, go_json_dumps(status, pretty=True)
    elif chosen.media_type == PROTOBUF:
        media, data = PROTOBUF, _codec().from_json(status)
    elif chosen.media_type == YAML:
        # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
        from kproxy.codec import to_yaml

        media, data = YAML, to_yaml(status)
    else:
        media = JSON
        data = err.body(pretty=chosen.pretty or is_pretty(query.get("pretty"), headers.get("User-Agent")))
    out = CIMultiDict(err.headers())
    out["Content-Type"] = "application/json" if media == JSON else media
    return Reply(err.http_status, out, BytesBody(data, media))
