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

Hence the answers, by what the request may do and whether any of it reached the upstream:

* **Reads** (``GET``/``HEAD``: get, list, watch, discovery): ``429 TooManyRequests`` Status with
  ``Retry-After: 1`` (``details.retryAfterSeconds``), the apiserver's own "not processed, come
  back" (it sends 429 + ``Retry-After`` while shutting down,
  ``apiserver/pkg/server/filters/with_retry_after.go``; the watch cache 429s with 1 s while it
  initialises). client-go retries it in the request, the reflector keeps its watch's resource
  version, kubectl and the Python client (urllib3 honours ``Retry-After`` on 429) wait and retry.
* **A write that never left kproxy** (the upstream refused the connection, or did not answer the
  connect in ``upstream.connect_timeout``; or kproxy could not review the caller's token): ``429``
  with ``Retry-After: 5``, the apiserver's own answer to a write it did not process while it shuts
  down (``with_retry_after.go`` sends 5). It is true (nothing was processed), and client-go's request
  retries it 10 times, 5 s apart, before its caller sees it: clients that retry a refused
  connection but not a broken one (KWOK's pod and node status writers retry only refused
  connections, 429, 503 and timeouts) keep going, and an event written in an outage up to ~50 s
  long arrives.
* **A write that broke off after it was sent**: no answer at all — :class:`NoAnswer`, the connection
  is closed, which is what a client of an apiserver that dies mid-request sees: client-go reports
  a transport error, its event recorder keeps the event and tries again, and nothing pretends the
  write was refused when it may have been applied.
"""

from __future__ import annotations

from kproxy.core.status import StatusError, too_many_requests

__all__ = ["RETRY_AFTER_SECONDS", "SAFE_METHODS", "WRITE_RETRY_AFTER_SECONDS", "NoAnswer", "upstream_failed"]

#: Methods whose request the apiserver never acts on beyond reading: asking again is harmless.
SAFE_METHODS = frozenset({"GET", "HEAD"})

#: How long a read is asked to wait, as the watch cache's own 429 ("storage is (re)initializing").
RETRY_AFTER_SECONDS = 1
#: How long a write that was not sent is asked to wait: the apiserver's own while it shuts down.
WRITE_RETRY_AFTER_SECONDS = 5


class NoAnswer(Exception):
    """The client gets no HTTP answer: the server closes its connection, as an apiserver that
    cannot be reached (or dies mid-request) leaves its clients. The message is for kproxy's log."""


def upstream_failed(method: str, detail: str, *, sent: bool = True) -> StatusError | NoAnswer:
    """The answer (an exception to raise) to a request the upstream could not complete; ``sent``
    is False when no byte of it reached the upstream."""
    message = f"the upstream kube-apiserver is unavailable: {detail}"
    if method.upper() in SAFE_METHODS:
        return too_many_requests(message, RETRY_AFTER_SECONDS)
    if not sent:
        return too_many_requests(message, WRITE_RETRY_AFTER_SECONDS)
    return NoAnswer(message)
