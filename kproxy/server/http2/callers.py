"""Which HTTP/2 connections to the apiserver a forwarded caller's request goes on.

In ``credentials: forward`` each request carries its caller's own token to the apiserver. The
apiserver ends an HTTP/2 connection with GOAWAY after a request it answers 401 or serves as the
anonymous user (its ``UnauthenticatedHTTP2DOSMitigation``,
staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go): on connections shared by
every caller, one caller without valid credentials would end the connection under everyone's
requests, and the writes whose bodies were already streaming could not be sent again. So, as each
client-go process has a connection of its own to the apiserver:

- a request without ``Authorization`` goes on HTTP/1.1, where the apiserver ends nothing;
- each credential has HTTP/2 connections of its own (at most ``MAX_CALLERS`` credentials at
  once; the least recently used whose connections have all closed makes room), so a 401 ends
  only its own caller's connection;
- a credential the apiserver answered 401 goes on HTTP/1.1 for ``REFUSED_FOR`` seconds, and new
  credentials get connections of their own at a bounded rate (``NEW_PER_SECOND``, ``NEW_BURST``):
  past it they go on HTTP/1.1 too, so a caller inventing tokens cannot make kproxy dial the
  apiserver once per request.

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
    return hashlib.blake2b(authorization.encode("utf-8", "surrogateescape"), digest_size=16).digest()


class CallerPools:
    """HTTP/2 pools by caller credential (forward mode)."""

    def __init__(self, make: Callable[[], H2Pool], clock: Callable[[], float] = time.monotonic) -> None:
        self._make = make
        self._clock = clock
        self._pools: OrderedDict[bytes, H2Pool] = OrderedDict()
        self._refused: OrderedDict[bytes, float] = OrderedDict()
        self._tokens = NEW_BURST
        self._stamp = clock()

    def pool(self, authorization: str | None) -> tuple[H2Pool | None, bytes]:
        """The pool for a request with this ``Authorization`` (None: HTTP/1.1) and its key."""
        if not authorization:
            return None, b""
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

    def refused(self, key: bytes) -> None:
        """The apiserver answered this credential 401: HTTP/1.1 for it a while."""
        if not key:
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
