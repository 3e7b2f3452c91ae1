"""Decoding a reply the upstream sent gzip-encoded, once, for whoever needs its plain bytes.

With ``upstream_gzip`` the compression filter asks the apiserver for gzip; a filter further down
the chain that must read the body calls ``decode_reply(reply)``: the body becomes the decoded
stream (or bytes), ``Content-Encoding`` and ``Content-Length`` go, and a later call (the
compression filter's own) sees a plain body and does nothing more.
"""

from __future__ import annotations

from kproxy.compress import stream
from kproxy.compress.backends import gzip_decoder
from kproxy.core.chain import BytesBody, Reply, StreamBody

#: ``Exchange.state`` key set by the compression filter when it asked the upstream for gzip: a
#: filter below that rewrites the request (transcode) keeps ``Accept-Encoding: gzip`` then and
#: decodes the reply with :func:`decode_reply`, instead of asking for an unencoded body.
ASKED = "kproxy.core.upstreamgzip.asked"


def _ignore(n_in: int, n_out: int, seconds: float) -> None:
    return None


def decode_reply(reply: Reply, account: stream.Account = _ignore) -> bool:
    """Make a gzip-encoded reply body plain; False when it is not gzip (nothing done)."""
    if reply.headers.get("Content-Encoding", "").strip().lower() != "gzip":
        return False
    body = reply.body
    if isinstance(body, BytesBody):
        dec = gzip_decoder()
        reply.body = BytesBody(dec.decompress(body.data) + dec.finish(), body.media_type)
    elif isinstance(body, StreamBody):
        out = stream.decode(body.chunks(), gzip_decoder(), account)
        reply.body = StreamBody(out, None, body.media_type, on_abort=body.abort, on_end=body.end_cleanly)
    else:
        return False
    reply.headers.popall("Content-Encoding")
    reply.headers.popall("Content-Length", None)
    return True
