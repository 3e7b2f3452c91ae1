"""Which HTTP/2 connections to the apiserver a forwarded caller's request goes on.

In ``credentials: forward`` each request carries its caller's own token to the apiserver. The
apiserver ends an HTTP/2 connection with GOAWAY after a request it answers 401 or serves as the
anonymous user (its ``UnauthenticatedHTTP2DOSMitigation``,
staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go): on connections shared by
every caller, one caller without valid credentials would end the connection under everyone's
requests, and the writes whose bodies were already streaming could not be sent again. So kproxy
keeps the connections a caller would have had going direct:

- the requests of one client HTTP/2 connection (a client-go process: every credential it uses,
  service-account tokens per controller included) go on HTTP/2 connections of their own; when
  the apiserver ends one after an unauthenticated request, kproxy ends that client's connection
  the same way (``ProxyServer._unauthenticated_h2``), as the apiserver would have;
- a request that came over HTTP/1.1 goes on its credential's own HTTP/2 connections, or on
  HTTP/1.1 when it has no ``Authorization`` (the apiserver ends no HTTP/1.1 connection);
- a credential the apiserver answered 401 goes on HTTP/1.1 for ``REFUSED_FOR`` seconds;
- new partitions get connections at a bounded rate (``NEW_PER_SECOND``, ``NEW_BURST``) and at most
  ``MAX_CALLERS`` exist at once (the least recently used whose connections have all closed makes
  room): past that, requests go on HTTP/1.1, so a caller inventing tokens or connections cannot
  make kproxy dial the apiserver once per request.

Credentials are keyed by a hash: no token is kept here.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from kproxy.server.http2.client import H2Pool

MAX_CALLERS = 256
REFUSED_FOR = 60.0
NEW_PER_SECOND = 10.0
NEW_BURST = 50.0


def credential_key(authorization: str) -> bytes:
    return b"t" + hashlib.blake2b(authorization.encode("utf-8", "surrogateescape"), digest_size=16).digest()


class CallerPools:
    """HTTP/2 pools by caller credential (forward mode)."""

    def __init__(self, make: Callable[[], H2Pool], clock: Callable[[], float] = time.monotonic) -> None:
        self._make = make
        self._clock = clock
        self._pools: OrderedDict[bytes, H2Pool] = OrderedDict()
        self._refused: OrderedDict[bytes, float] = OrderedDict()
        self._tokens = NEW_BURST
        self._stamp = clock()

    def pool(self, authorization: str | None, connection: int | None = None) -> tuple[H2Pool | None, bytes]:
        """The pool for a request with this ``Authorization`` that came on the client HTTP/2
        connection numbered ``connection`` (None: HTTP/1.1), or None for HTTP/1.1; and its key."""
        if connection is not None:
            key = b"c" + connection.to_bytes(8, "big")
        elif not authorization:
            return None, b""
        else:
            key = credential_key(authorization)
        pool = self._pools.get(key)
        if pool is not None:
            self._pools.move_to_end(key)
            return pool, key
        now = self._clock()
        refused = self._refused.get(key)
        if refused is not None:
            if now < refused:
                return None, key
            del self._refused[key]
        self._tokens = min(NEW_BURST, self._tokens + (now - self._stamp) * NEW_PER_SECOND)
        self._stamp = now
        if self._tokens < 1 or not self._room():
            return None, key
        self._tokens -= 1
        pool = self._pools[key] = self._make()
        return pool, key

    def connection_closed(self, connection: int) -> None:
        """The client connection numbered ``connection`` closed: its upstream connections close
        once their streams have ended (as the client's own would have, going direct)."""
        key = b"c" + connection.to_bytes(8, "big")
        pool = self._pools.pop(key, None)
        if pool is not None:
            pool.close_when_idle()

    def refused(self, key: bytes) -> None:
        """The apiserver answered this partition 401: a credential goes on HTTP/1.1 a while; a
        client connection's partition goes (kproxy ends that client connection too)."""
        if not key:
            return
        if key[:1] == b"c":
            pool = self._pools.get(key)
            if pool is not None and not any(conn.streams for conn in pool.conns):
                del self._pools[key]
                pool.close()
            return
        pool = self._pools.pop(key, None)
        if pool is not None and not any(conn.streams for conn in pool.conns):
            pool.close()
        elif pool is not None:
            self._pools[key] = pool  # requests of its own still run on it; it stays until they end
        self._refused[key] = self._clock() + REFUSED_FOR
        self._refused.move_to_end(key)
        while len(self._refused) > 4 * MAX_CALLERS:
            self._refused.popitem(last=False)

    def _room(self) -> bool:
        if len(self._pools) < MAX_CALLERS:
            return True
        for key, pool in self._pools.items():  # least recently used first
            if not pool.conns and not pool.dialing:
                del self._pools[key]
                pool.close()
                return True
        return False

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def __len__(self) -> int:
        return len(self._pools)
