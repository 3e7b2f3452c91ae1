"""Continue tokens for lists paginated from a cache snapshot, and for lists continued at the latest
resource version after the first one's revision was compacted away.

kproxy's tokens have the apiserver's own format (``storage/continue.go``): base64 URL alphabet
without padding of ``{"v":"meta.k8s.io/v1","rv":<int>,"start":"<key after the last item>"}``,
where ``start`` is the last returned key relative to the list's etcd prefix (which has no
trailing slash, so ``/name`` or ``/namespace/name``) plus ``\\0``. One more
member, ``"kp":1``, says kproxy issued it. Go's JSON decoder ignores unknown members, so a
kproxy token is also a token the apiserver accepts: when the cache can no longer rebuild the
snapshot (its history moved past ``rv``), the request goes to the apiserver unchanged and the
apiserver continues the same list from etcd at the same revision (or answers its own 410).
A token without ``kp`` at a positive ``rv`` came from the apiserver and is always passed through.

A negative ``rv`` is the apiserver's "inconsistent continue" (``etcd3/store.go``,
``handleCompactedErrorForPaging``): the 410 for a token whose revision etcd compacted carries a
token at ``rv`` -1 that continues after the same key at the latest resource version. The
apiserver's cacher serves any negative ``rv`` as a consistent read from the key
(``Cacher.ShouldDelegateContinue``), and so does kproxy, whoever issued the token: it names no
snapshot, only a key.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

import orjson

from kproxy.gocompat.jsonescape import go_escape

_VERSION = "meta.k8s.io/v1"
# Go's base64.RawURLEncoding: the URL alphabet, no padding (it skips only CR and LF). Python's
# decoder would also take "+", "/", "=" and drop any other character, so a token the apiserver
# rejects as garbage could otherwise be served from the cache.
_RAW_URL_B64 = re.compile(r"[A-Za-z0-9_-]*")
# Go's encoding/json matches member names case-insensitively (with Unicode folding: "\u017ftart" is
# "start") and the last of duplicates wins, so a token with any other member than these could
# mean something else to the apiserver than to a plain reader: the apiserver answers it.
_MEMBERS = frozenset({"v", "rv", "start", "kp"})
_INT64 = 1 << 63


@dataclass(frozen=True, slots=True)
class ContinueToken:
    rv: int  # negative: continue at the latest resource version (an inconsistent continue)
    start: str  # relative to the list prefix, ending in "\0"

    @property
    def latest(self) -> bool:
        return self.rv < 0


def encode_continue(rv: int, last_key: str) -> str:
    payload = orjson.dumps({"v": _VERSION, "rv": rv, "start": last_key + "\x00", "kp": 1})
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def encode_inconsistent(start: str) -> str:
    """The token the apiserver puts in its 410 for an expired ``start`` (a token's own start
    key): ``storage.EncodeContinue(key, keyPrefix, -1)``, whose prefix ends in "/", so the key
    loses its leading "/". Byte for byte the apiserver's (Go's field order and escaping)."""
    rel = start.removeprefix("/")
    payload = go_escape(orjson.dumps({"v": _VERSION, "rv": -1, "start": rel}))
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def decode_continue(token: str) -> ContinueToken | None:
    """A token the cache serves (one kproxy issued, or any at a negative ``rv``), or None (the
    apiserver's own at a revision, or anything unreadable: the apiserver then answers it, with
    its own error if it is garbage)."""
    token = token.replace("\r", "").replace("\n", "")
    if not _RAW_URL_B64.fullmatch(token):
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not data.keys() <= _MEMBERS or data.get("v") != _VERSION:
        return None
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or not -_INT64 <= rv < _INT64 or rv == 0:
        return None
    if rv > 0 and data.get("kp") != 1:
        return None  # the apiserver's snapshot, not the cache's
    if "kp" in data and data["kp"] != 1:
        return None
    if not isinstance(start, str) or not start:
        return None
    if not _clean(start if start.startswith("/") else "/" + start):
        return None  # the apiserver answers "continue key is not valid"
    return ContinueToken(rv, start)


def _clean(key: str) -> bool:
    """Whether Go's ``path.Clean`` leaves ``key`` (which starts with "/") unchanged, as
    ``storage.DecodeContinue`` requires: no empty, "." or ".." element, no trailing slash."""
    if key == "/":
        return True
    return all(part not in ("", ".", "..") for part in key[1:].split("/"))
