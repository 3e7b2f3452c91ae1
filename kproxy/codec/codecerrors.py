"""The one error the codec raises."""

from __future__ import annotations

import orjson


class CodecError(ValueError):
    """Input the codec cannot decode or encode faithfully.

    The message is written for a client: the filter that adapts the codec to HTTP turns it into
    an apiserver-shaped Status error (usually 400 or 406), so it never carries a traceback.
    """


# What a string that is not UTF-8 would raise on its way to JSON if it slipped past the codec's
# handling (upb hands such a string over as bytes, which the codec writes as Go does with
# kproxy.gocompat.utf8; a map key that is not UTF-8 cannot be looked up in upb's map, and the
# codec reads that map from its entries). Kept so that anything missed is a clean error.
NOT_UTF8 = (orjson.JSONEncodeError, UnicodeDecodeError)


def not_utf8(e: Exception) -> CodecError:
    """One of NOT_UTF8 -> a clean error instead of a traceback."""
    return CodecError(f"invalid protobuf data: a string field is not valid UTF-8 ({e})")
