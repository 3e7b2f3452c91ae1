"""The one error the codec raises."""

from __future__ import annotations


class CodecError(ValueError):
    """Input the codec cannot decode or encode faithfully.

    The message is written for a client: the filter that adapts the codec to HTTP turns it into
    an apiserver-shaped Status error (usually 400 or 406), so it never carries a traceback.
    """
