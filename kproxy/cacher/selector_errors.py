"""The one error type of the cache's selector parsers.

The watch cache answers a LIST with ``labelSelector``/``fieldSelector`` itself only when the apiserver
would accept the selector.  Whatever the apiserver rejects (a syntax error, an invalid label key or
value, a field the resource does not support) raises :class:`SelectorError`; the cache then passes the
request to the apiserver untouched so the client gets the apiserver's own Status word for word.  The
message is the apiserver's text as far as it was ported (best effort; tests compare it for the common
cases) and ``code`` is the HTTP status it answers with: every selector error is a ``400 BadRequest``
(``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/get.go`` ``ListResource``: the query decoding
error and the ``FieldSelector.Transform`` error both become ``errors.NewBadRequest``).
"""

from __future__ import annotations

__all__ = ["SelectorError"]


class SelectorError(ValueError):
    """A selector the apiserver rejects; ``str(err)`` is the apiserver's message (best effort)."""

    code: int = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
