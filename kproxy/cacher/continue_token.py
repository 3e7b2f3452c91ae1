"""Continue tokens for lists paginated from a cache snapshot.

kproxy's tokens have the apiserver's own format (``storage/continue.go``): base64 URL alphabet
without padding of ``{"v":"meta.k8s.io/v1","rv":<int>,"start":"<key after the last item>"}``,
where ``start`` is the last returned key relative to the list's etcd prefix (which has no
trailing slash, so ``/name`` or ``/namespace/name``) plus ``\\0``. One more
member, ``"kp":1``, says kproxy issued it. Go's JSON decoder ignores unknown members, so a
kproxy token is also a token the apiserver accepts: when the cache can no longer rebuild the
snapshot (its history moved past ``rv``), the request goes to the apiserver unchanged and the
apiserver continues the same list from etcd at the same revision (or answers its own 410).
A token without ``kp`` came from the apiserver and is always passed through.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

import orjson

_VERSION = "meta.k8s.io/v1"
# Go's base64.RawURLEncoding: the URL alphabet, no padding (it skips only CR and LF). Python's
# decoder would also take "+", "/", "=" and drop any other character, so a token the apiserver
# rejects as garbage could otherwise be served from the cache.
_RAW_URL_B64 = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class ContinueToken:
    rv: int
    start: str  # relative to the list prefix, ending in "\0"


def encode_continue(rv: int, last_key: str) -> str:
    payload = orjson.dumps({"v": _VERSION, "rv": rv, "start": last_key + "\x00", "kp": 1})
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def decode_continue(token: str) -> ContinueToken | None:
    """A token kproxy issued, or None (the apiserver's own, or anything unreadable: the
    apiserver then answers it, with its own error if it is garbage)."""
    token = token.replace("\r", "").replace("\n", "")
    if not _RAW_URL_B64.fullmatch(token):
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("kp") != 1 or data.get("v") != _VERSION:
        return None
    rv, start = data.get("rv"), data.get("start")
    if not isinstance(rv, int) or isinstance(rv, bool) or rv <= 0 or not isinstance(start, str) or not start:
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
