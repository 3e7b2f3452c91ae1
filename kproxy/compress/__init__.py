"""The compression engine (no aiohttp): Accept-Encoding negotiation, codec backends, streaming
encoders and the header rules of a re-encoded response. ``kproxy.filters.compression`` adapts
it to the chain.

May import: nothing else of kproxy (no aiohttp, no filter, no server).
"""

from kproxy.compress.backends import Codec, Decoder, Encoder, codec, gzip_codec, gzip_decoder, zstd_codec
from kproxy.compress.negotiate import Negotiated, negotiate, parse

__all__ = [
    "Codec",
    "Decoder",
    "Encoder",
    "Negotiated",
    "codec",
    "gzip_codec",
    "gzip_decoder",
    "negotiate",
    "parse",
    "zstd_codec",
]
