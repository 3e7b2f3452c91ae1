"""Go's ``net.SplitHostPort`` (Go 1.26 ``src/net/ipsock.go``), which ``kubectl proxy`` applies to
``req.Host`` before it matches ``--accept-hosts`` (staging/src/k8s.io/kubectl/pkg/proxy/proxy_server.go
``extractHost``: on an error the whole value is the host).

Its quirks decide what a host pattern sees, so they are kept exactly: ``[::1]:8001`` gives ``::1``
(no brackets), ``[::1]`` and ``::1`` fail (missing port, too many colons), ``localhost:`` gives
``localhost``, and the port is not checked (``127.0.0.1:abc`` gives ``127.0.0.1``).
"""

from __future__ import annotations

__all__ = ["AddrError", "split_host_port"]


class AddrError(ValueError):
    """``net.AddrError`` from SplitHostPort; ``str`` is Go's ``Err`` text."""


def split_host_port(hostport: str) -> tuple[str, str]:
    """``net.SplitHostPort(hostport)``: ``(host, port)``, or AddrError where Go returns an error."""
    i = hostport.rfind(":")
    if i < 0:
        raise AddrError("missing port in address")
    j = k = 0
    if hostport[0] == "[":
        end = hostport.find("]")
        if end < 0:
            raise AddrError("missing ']' in address")
        if end + 1 == len(hostport):
            raise AddrError("missing port in address")
        if end + 1 != i:
            if hostport[end + 1] == ":":
                raise AddrError("too many colons in address")
            raise AddrError("missing port in address")
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            raise AddrError("too many colons in address")
    if "[" in hostport[j:]:
        raise AddrError("unexpected '[' in address")
    if "]" in hostport[k:]:
        raise AddrError("unexpected ']' in address")
    return host, hostport[i + 1 :]
