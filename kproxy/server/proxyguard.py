"""``credentials: proxy``'s request filter: kubectl proxy's ``FilterServer``, with its defaults.

In proxy mode whoever reaches the listener acts with kproxy's own credentials. A loopback
listener is reachable by every web page the user opens: through DNS rebinding a page on
``evil.example.com`` gets its requests sent to 127.0.0.1 with ``Host: evil.example.com``, and
reads the answers. ``kubectl proxy`` refuses those (its ``--accept-hosts`` default names only
loopback hosts) and refuses exec and attach (``--reject-paths``), which a page could otherwise
open as a cross-site WebSocket. kproxy applies the same checks, with the same defaults and the
same meaning, to the same things Go would see (staging/src/k8s.io/kubectl/pkg/proxy/proxy_server.go,
``FilterServer.ServeHTTP`` and ``accept``):

* the host is Go's ``req.Host`` (the authority of an absolute-form target, else the Host header;
  ``Exchange.host``) through ``net.SplitHostPort``, or the whole value where that fails
  (``extractHost``): ``localhost:8001`` is ``localhost``, ``[::1]:8001`` is ``::1``;
* the path is Go's ``req.URL.Path``, percent-decoded (``RequestInfo.path``): ``%2F`` and ``%65``
  spellings are matched as the apiserver routes them;
* the method is as sent (Go's methods are case-sensitive).

One check goes beyond kubectl proxy (``proxy.check_origin``, on by default): a request carrying
an ``Origin`` header must name an accepted host there too. A page on any site can open a
WebSocket to ``localhost`` (its Host is then an accepted one) and read what comes back, such as a
watch of Secrets; the browser says where the page came from only in ``Origin``.

A request refused gets kubectl proxy's answer, ``http.Error(rw, "Forbidden", 403)``: ``403``,
``text/plain; charset=utf-8``, ``nosniff``, body ``Forbidden\\n``. It never reaches a filter or
the apiserver. The other modes are not filtered: there each caller's own credentials (or none)
reach the apiserver, so a page that reaches kproxy gains nothing it could not do directly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from multidict import CIMultiDict

from kproxy.config import Config, ProxyConfig, is_loopback
from kproxy.core.chain import BytesBody, Exchange, Reply
from kproxy.gocompat.net import AddrError, split_host_port
from kproxy.gocompat.regexp import compile_go_regexp
from kproxy.gocompat.url import InvalidRequestURIError, parse_request_uri

__all__ = ["FORBIDDEN", "ProxyGuard", "extract_host", "proxy_guard"]

log = logging.getLogger("kproxy")

#: Go's ``http.Error(rw, http.StatusText(http.StatusForbidden), http.StatusForbidden)``.
FORBIDDEN = b"Forbidden\n"


def extract_host(host: str) -> str:
    """kubectl proxy's ``extractHost``: the host of ``host:port``, else the whole value."""
    try:
        return split_host_port(host)[0]
    except AddrError:
        return host


def _matches(value: str, patterns: list[re.Pattern[str]]) -> bool:
    """``matchesRegexp``: any pattern found anywhere in ``value`` (Go's ``MatchString``)."""
    return any(p.search(value) is not None for p in patterns)


class ProxyGuard:
    """The filter for one config; ``refuse`` answers a request it does not accept."""

    def __init__(self, settings: ProxyConfig, on_refuse: Callable[[str], None] | None = None) -> None:
        self.accept_hosts = [compile_go_regexp(p) for p in settings.accept_hosts]
        self.accept_paths = [compile_go_regexp(p) for p in settings.accept_paths]
        self.reject_paths = [compile_go_regexp(p) for p in settings.reject_paths]
        self.reject_methods = [compile_go_regexp(p) for p in settings.reject_methods]
        self.check_origin = settings.check_origin
        self._on_refuse = on_refuse

    def why_not(self, method: str, path: str, host: str, origins: list[str] | None = None) -> str | None:
        """``FilterServer.accept`` with its order of checks: None where it accepts, else which check
        refused (``path``, ``method``, ``host`` or ``origin``; kubectl proxy tells no one, kproxy's
        metric does). ``origins`` are the request's Origin headers (see :meth:`_origin_ok`)."""
        if _matches(path, self.reject_paths):
            return "path"
        if _matches(method, self.reject_methods):
            return "method"
        if not _matches(path, self.accept_paths):
            return "path"
        if not _matches(extract_host(host), self.accept_hosts):
            return "host"
        if self.check_origin and origins and not all(self._origin_ok(o) for o in origins):
            return "origin"
        return None

    def _origin_ok(self, origin: str) -> bool:
        """An Origin (RFC 6454: ``scheme://host[:port]``, or ``null`` for an opaque one) whose host
        is an accepted host. Browsers send it on every WebSocket handshake and cross-site request,
        which the Host check alone cannot catch: the page's request names the loopback host it
        was sent to. kubectl, client-go and the Python client send none (or their target's)."""
        try:
            uri = parse_request_uri(origin.strip())
        except InvalidRequestURIError:
            return False
        if not uri.host or uri.path or uri.raw_query:
            return False
        return _matches(extract_host(uri.host), self.accept_hosts)

    def refuse(self, ex: Exchange) -> Reply | None:
        """kubectl proxy's 403 for a request the filter does not accept, else None."""
        why = self.why_not(ex.method, ex.info.path, ex.host, ex.headers.getall("Origin", None))
        if why is None:
            return None
        if self._on_refuse is not None:
            self._on_refuse(why)
        headers = CIMultiDict(
            {
                "Content-Type": "text/plain; charset=utf-8",
                "X-Content-Type-Options": "nosniff",
                # Kept for a HEAD answer (Go counts the body it would have written); a body's own
                # length replaces it otherwise.
                "Content-Length": str(len(FORBIDDEN)),
            }
        )
        return Reply(403, headers, BytesBody(FORBIDDEN, "text/plain; charset=utf-8"))


def proxy_guard(cfg: Config, on_refuse: Callable[[str], None] | None = None) -> ProxyGuard | None:
    """The guard ``cfg`` asks for: None outside ``credentials: proxy`` or with ``disable_filter``."""
    if cfg.credentials != "proxy" or cfg.proxy.disable_filter:
        return None
    if not is_loopback(cfg.listen.host) and cfg.proxy.accept_hosts == ProxyConfig().accept_hosts:
        log.warning(
            "listening on a non-loopback address, but proxy.accept_hosts names only loopback hosts: "
            "requests that name another host get 403 Forbidden (as from kubectl proxy)",
            extra={"listen": cfg.listen.host},
        )
    return ProxyGuard(cfg.proxy, on_refuse)
