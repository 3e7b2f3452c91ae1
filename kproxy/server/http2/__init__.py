"""HTTP/2 for kproxy: the TLS listener's h2 connections (``server``, ``stream``) and the
settings they serve with (``settings``).

A client that offers ``h2`` in ALPN (client-go, kubectl, curl) gets an HTTP/2 connection, as the
apiserver gives it: every request on it is a stream that becomes an ``Exchange`` and runs through
the same chain as an HTTP/1.1 request. Framing, HPACK and stream states are python-hyper's ``h2``
(sans-IO); the asyncio protocol, flow control towards the chain and Go's limits are here.
"""
