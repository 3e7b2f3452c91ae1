"""The one error the codec raises."""

from __future__ import annotations

import orjson


class CodecError(ValueError):
    """Input the codec cannot decode or encode faithfully.

    The message is written for a client: the filter that adapts the codec to HTTP turns it into
    an apiserver-shaped Status error (usually 400 or 406), so it never carries a traceback.
    """


# What a string field whose bytes are not UTF-8 raises on its way to JSON: upb hands it over as
# bytes, which orjson refuses, or fails to decode it (repeated fields, map keys).
NOT_UTF8 = (orjson.JSONEncodeError, UnicodeDecodeError)


def not_utf8(e: Exception) -> CodecError:
    """One of NOT_UTF8 -> a clean error instead of a traceback. (Go would print U+FFFD for each
    bad byte; kproxy declines such data rather than guess at byte-identical output.)"""
    return CodecError(f"invalid protobuf data: a string field is not valid UTF-8 ({e})")
