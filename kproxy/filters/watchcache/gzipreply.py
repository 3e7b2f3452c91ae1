"""A cached answer compressed as the apiserver compresses its own (``SerializeObject``: gzip
level 1 for a body over 128 KiB when the first Accept-Encoding line holds ``gzip``)."""

from __future__ import annotations

from kproxy.compress.backends import Codec
from kproxy.core.chain import BytesBody, Exchange, Reply

__all__ = ["GZIP_THRESHOLD", "gzip_as_the_apiserver"]

GZIP_THRESHOLD = 128 * 1024  # defaultGzipThresholdBytes: compressed only when strictly larger


def gzip_as_the_apiserver(ex: Exchange, reply: Reply, gzip: Codec) -> Reply:
    """Compress as the apiserver's ``SerializeObject`` would: the first Accept-Encoding line holds
    the exact token ``gzip`` and the body is over 128 KiB -> gzip level 1, ``Vary`` added. With
    the ``compression`` filter in front, it has already taken the client's header off (or left
    ``gzip`` for itself), so this only acts where kproxy would otherwise answer worse than the
    apiserver."""
    first = ex.headers.get("Accept-Encoding", "")
    body = reply.body
    if not first or not isinstance(body, BytesBody) or len(body.data) <= GZIP_THRESHOLD:
        return reply
    if "gzip" not in (t.strip() for t in first.split(",")):
        return reply
    reply.body = BytesBody(gzip.compress(body.data), body.media_type)
    reply.headers["Content-Encoding"] = "gzip"
    reply.headers.add("Vary", "Accept-Encoding")
    return reply
