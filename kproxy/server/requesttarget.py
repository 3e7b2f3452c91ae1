"""What the request line says before any filter runs: the target as Go's server reads it, its
RequestInfo, and whether the request is long-running (no request timeout)."""

from __future__ import annotations

import functools

from kproxy.core.requestinfo import RequestInfo, RequestInfoError, request_info_for
from kproxy.gocompat.url import InvalidRequestURIError, RequestURI, parse_request_uri

__all__ = ["is_long_running", "read_target"]

#: ``BasicLongRunningRequestCheck`` as kube-apiserver configures it (``cmd/kube-apiserver/app/server.go``):
#: the requests the request timeout does not apply to.
_LONG_RUNNING_VERBS = frozenset(("watch", "proxy"))
_LONG_RUNNING_SUBRESOURCES = frozenset(("attach", "exec", "proxy", "log", "portforward"))


def is_long_running(info: RequestInfo) -> bool:
    """``staging/src/k8s.io/apiserver/pkg/server/filters/longrunning.go``."""
    if info.verb in _LONG_RUNNING_VERBS:
        return True
    if info.is_resource_request:
        return info.subresource in _LONG_RUNNING_SUBRESOURCES
    return info.path.startswith("/debug/pprof/")


@functools.lru_cache(maxsize=1024)
def read_target(method: str, raw: str) -> tuple[RequestURI, RequestInfo] | None:
    """The request target as Go's server reads it (``url.ParseRequestURI``) and its RequestInfo;
    None where Go's server answers 400 itself. An absolute-form target (``http://any/api/...``) is
    classified and sent upstream by its path, as Go routes it: the filters see what the apiserver
    will serve. A scheme with an opaque rest (``http:x``, an empty path to Go) has no origin form to
    send; kproxy refuses it too.

    Cached by request line (both are immutable): controllers and kubelets send the same GETs,
    LISTs and watches over and over, and parsing was 4% of a small GET's CPU in kproxy."""
    try:
        uri = parse_request_uri(raw)
    except InvalidRequestURIError:
        return None
    if uri.opaque or (uri.path == "*" and uri.absolute):
        return None
    try:
        return uri, request_info_for(method, uri)
    except RequestInfoError as err:
        return uri, err.info
