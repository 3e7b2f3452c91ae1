"""The one Status writer: ``err`` written as the apiserver writes it.

``negotiated_status`` is ``responsewriters.ErrorNegotiated``: the media type the request's
``Accept`` negotiates with the default endpoint restrictions (no ``as=`` conversions), JSON
pretty for ``?pretty`` or a human client, and indented JSON without a newline
(``WriteRawJSON``) when nothing is acceptable. ``encoded_status`` writes a Status with an
encoder already chosen (the transcode filter's answer to an encoder failure, which the
apiserver writes with the encoder it negotiated for the object).

``Reply.from_status(err, ex)`` (kproxy.core.chain) builds its Reply from these: this module
imports nothing from ``chain``, so ``chain`` imports it at module level without a cycle.

The protobuf form uses the process's one codec (``kproxy.codec.shared_codec``), the same
instance the filters use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from multidict import CIMultiDict

from kproxy.core.negotiation import JSON, PROTOBUF, SERVED, YAML, is_pretty, negotiate
from kproxy.core.status import StatusError


def negotiated_media(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str, bool]:
    """The media type and JSON prettiness ``ErrorNegotiated`` writes a Status in for a request
    with these headers and query: indented JSON when nothing is acceptable."""
    chosen = negotiate(headers.get("Accept"), SERVED, conversions=False)
    if chosen is None:
        return JSON, True  # WriteRawJSON: indented, no newline
    if chosen.media_type != JSON:
        return chosen.media_type, False
    return JSON, chosen.pretty or is_pretty(query.get("pretty"), headers.get("User-Agent"))


def encoded_status(err: StatusError, media: str, pretty: bool = False) -> tuple[CIMultiDict[str], bytes]:
    """The headers and body of ``err`` written in ``media`` (JSON, YAML or protobuf)."""
    if media == PROTOBUF:
        # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
        from kproxy.codec import shared_codec

        data = shared_codec().from_json(err.body())
    elif media == YAML:
        # lazy: as above
        from kproxy.codec import to_yaml

        # from the JSON form: plain values (a cause's type is an enum in ``to_dict``)
        data = to_yaml(json.loads(err.body()))
    else:
        media, data = JSON, err.body(pretty=pretty)
    headers = CIMultiDict(err.headers())
    headers["Content-Type"] = media
    return headers, data


def negotiated_status(
    err: StatusError, headers: Mapping[str, str], query: Mapping[str, str]
) -> tuple[int, CIMultiDict[str], bytes, str]:
    """``err`` as the apiserver answers it to a request with these headers and query: the HTTP
    status, response headers, body and its media type."""
    media, pretty = negotiated_media(headers, query)
    out, data = encoded_status(err, media, pretty)
    return err.http_status, out, data, media
