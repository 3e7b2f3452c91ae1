"""What a client is answered when kproxy cannot complete its request because the upstream
kube-apiserver is down or broke off.

The answer is chosen so that clients behave as they do when the apiserver itself is unreachable
(they retry, back off, keep their resource versions, lose nothing), which is decided by client-go
(k8s.io/client-go v0.37, the code the controllers, kubectl and the scheduler run):

* ``tools/cache/reflector.go`` ``isWatchErrorRetriable``: a refused connection **or a 429** makes
  the reflector back off and open the same watch again, from the resource version it has; any
  other failed watch (a 503 Status included) ends ``ListAndWatch`` and the informer relists.
* ``tools/record/event.go`` ``recordEvent`` (and ``tools/events/event_broadcaster.go``): an event
  whose write fails with *any* ``*errors.StatusError`` is dropped ("Server rejected event (will
  not retry!)"); a transport error is retried (12 tries, 10 s apart). Every HTTP answer with an
  error code becomes a ``StatusError`` in ``rest/request.go`` (``transformResponse``), so only
  *no answer* keeps an event.
* ``rest/request.go`` / ``rest/with_retry.go``: a 429 or 5xx with ``Retry-After`` is retried by
  the request itself (``checkWait``, up to 10 times), a GET also after a reset connection; a
  write is never retried after a connection error (its outcome is unknown).

Hence two answers, by what the request may do:

* **Reads** (``GET``/``HEAD``: get, list, watch, discovery): ``429 TooManyRequests`` Status with
  ``Retry-After: 1`` (``details.retryAfterSeconds``), the apiserver's own "not processed, come
  back" (it sends 429 + ``Retry-After`` while shutting down,
  ``apiserver/pkg/server/filters/with_retry_after.go``; the watch cache 429s with 1 s while it
  initialises). client-go retries it in the request, the reflector keeps its watch's resource
  version, kubectl and the Python client (urllib3 honours ``Retry-After`` on 429) wait and retry.
* **Everything else** (writes): no answer at all — :class:`NoAnswer`, the connection is closed,
  which is what a client of an unreachable (or crashed) apiserver sees: client-go reports a
  transport error, its event recorder keeps the event and tries again, and nothing pretends the
  write was refused when it may not even have been read.
"""

from __future__ import annotations

from kproxy.core.status import StatusError, too_many_requests

__all__ = ["RETRY_AFTER_SECONDS", "SAFE_METHODS", "NoAnswer", "upstream_failed"]

#: Methods whose request the apiserver never acts on beyond reading: asking again is harmless.
SAFE_METHODS = frozenset({"GET", "HEAD"})

#: How long a read is asked to wait, as the watch cache's own 429 ("storage is (re)initializing").
RETRY_AFTER_SECONDS = 1


class NoAnswer(Exception):
    """The client gets no HTTP answer: the server closes its connection, as an apiserver that
    cannot be reached (or dies mid-request) leaves its clients. The message is for kproxy's log."""


def upstream_failed(method: str, detail: str) -> StatusError | NoAnswer:
    """The answer (an exception to raise) to a request the upstream could not complete."""
    message = f"the upstream kube-apiserver is unavailable: {detail}"
    if method.upper() in SAFE_METHODS:
        return too_many_requests(message, RETRY_AFTER_SECONDS)
    return NoAnswer(message)
