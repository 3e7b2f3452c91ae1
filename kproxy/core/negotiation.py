"""Accept negotiation exactly as kube-apiserver does it, so kproxy knows what a client would get.

A filter that changes the representation of a response (``transcode``) must first know what the
client negotiated: the same media type, the same pretty-printing, and the same refusals (the
request is then passed through so that the apiserver gives its own 406). Ported from:

* ``github.com/munnerz/goautoneg`` ``ParseAccept`` (split on ``,`` and ``;``, ``q`` as float32,
  malformed ranges skipped, ``q=0`` kept; sorted with its non-strict ``Less`` by Go's insertion
  sort, which is what ``sort.Sort`` runs for up to 12 clauses);
* ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/negotiation/negotiate.go``
  (``NegotiateMediaTypeOptions``, ``acceptMediaTypeOptions``, ``isPrettyPrint``);
* ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go`` (``AllowsMediaTypeTransform``:
  ``as=Table`` only for JSON and YAML, ``PartialObjectMetadata[List]`` for any type, both only in
  ``meta.k8s.io`` ``v1``/``v1beta1``);
* ``github.com/emicklei/go-restful/v3`` ``Route.matchesAccept`` (built-in routes answer 406 unless
  some Accept entry's bare type is one they produce, or is ``*/*``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from kproxy.gocompat.strings import to_lower, trim_space

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
PROTOBUF_WATCH = PROTOBUF + ";stream=watch"

#: The built-in serializers, in the apiserver's order (the first is the default).
SERVED: tuple[str, ...] = (JSON, YAML, PROTOBUF)
#: The serializers with a stream (watch) form.
STREAMING: frozenset[str] = frozenset({JSON, PROTOBUF})

_META_VERSIONS = frozenset({"v1", "v1beta1"})
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True, slots=True)
class AcceptClause:
    """One media range of an Accept header (goautoneg's ``Accept``)."""

    type: str
    subtype: str
    q: float
    params: tuple[tuple[str, str], ...] = ()

    def param(self, key: str) -> str | None:
        for k, v in self.params:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What ``NegotiateMediaTypeOptions`` chose: the serializer and the clause's options."""

    media_type: str
    pretty: bool = False
    stream: str = ""
    convert: tuple[str, str, str] | None = None  # (kind, group, version) of an ``as=`` transform

    @property
    def streams(self) -> bool:
        """Whether this serializer can encode a watch stream."""
        return self.media_type in STREAMING


def _parse_q(text: str) -> float:
    """``strconv.ParseFloat(s, 32)`` as goautoneg uses it: a syntax error gives 0 (the error is
    ignored), an out-of-range value infinity; the value is rounded to float32."""
    if not text or text.strip() != text or "_" in text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        return 0.0
    if value != value:  # NaN
        return value
    if abs(value) > _FLOAT32_MAX:
        return math.copysign(math.inf, value)
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _less(a: AcceptClause, b: AcceptClause) -> bool:
    """goautoneg's ``Less``: not a strict order, reproduced as is (its results depend on it)."""
    if a.q > b.q:
        return True
    if a.type != "*" and b.type == "*":
        return True
    return a.subtype != "*" and b.subtype == "*"


def parse_accept(header: str) -> list[AcceptClause]:
    """goautoneg ``ParseAccept``: the clauses in the order the apiserver tries them."""
    out: list[AcceptClause] = []
    for raw in header.split(","):
        part = raw.strip(" ")
        mrp = part.split(";")
        sp = mrp[0].split("/")
        typ = sp[0].strip(" ")
        if len(sp) == 1 and typ == "*":
            sub = "*"
        elif len(sp) == 2:
            sub = sp[1].strip(" ")
        else:
            continue
        q = 1.0
        params: list[tuple[str, str]] = []
        for param in mrp[1:]:
            kv = param.split("=", 1)
            if len(kv) != 2:
                continue
            token = kv[0].strip(" ")
            if token == "q":
                q = _parse_q(kv[1])
            else:
                params = [(k, v) for k, v in params if k != token]  # a Go map: the last one wins
                params.append((token, kv[1].strip(" ")))
        out.append(AcceptClause(typ, sub, q, tuple(params)))
    # sort.Sort -> pdqsort, which is an insertion sort for up to 12 elements.
    for i in range(1, len(out)):
        j = i
        while j > 0 and _less(out[j], out[j - 1]):
            out[j], out[j - 1] = out[j - 1], out[j]
            j -= 1
    return out


def _options(clause: AcceptClause, media_type: str, conversions: bool) -> Negotiated | None:
    """``acceptMediaTypeOptions`` with the endpoint restrictions of a resource endpoint
    (``conversions=True``) or the default ones used for errors (``False``)."""
    pretty = False
    stream = ""
    kind = group = version = None
    for key, value in clause.params:
        if key == "as":
            kind = value
        elif key == "g":
            group = value
        elif key == "v":
            version = value
        elif key == "stream":
            if value and (media_type not in STREAMING or value != "watch"):
                return None
            stream = value
        elif key == "sv":
            if value:
                return None  # AllowsServerVersion is false for every endpoint
        elif key == "pretty":
            pretty = value == "1"
    convert = None
    if kind is not None or group is not None or version is not None:
        convert = (kind or "", group or "", version or "")
        if not conversions or not _allows_transform(media_type, convert):
            return None
    return Negotiated(media_type, pretty, stream, convert)


def _allows_transform(media_type: str, convert: tuple[str, str, str]) -> bool:
    kind, group, version = convert
    if group != "meta.k8s.io" or version not in _META_VERSIONS:
        return False
    if kind == "Table":
        return media_type in (JSON, YAML)
    return kind in ("PartialObjectMetadata", "PartialObjectMetadataList")


def negotiate(accept: str | None, served: Sequence[str] = SERVED, *, conversions: bool = True) -> Negotiated | None:
    """``NegotiateMediaTypeOptions``: the serializer the apiserver would pick, or None (406).

    ``accept`` is the first Accept header line (``Header.Get``); empty or missing means the
    first serializer.
    """
    if not accept:
        return Negotiated(served[0]) if served else None
    for clause in parse_accept(accept):
        for media_type in served:
            typ, _, sub = media_type.partition("/")
            if (clause.type == typ and clause.subtype in (sub, "*")) or (clause.type == "*" and clause.subtype == "*"):
                chosen = _options(clause, media_type, conversions)
                if chosen is not None:
                    return chosen
    return None


def router_accepts(accept: str | None, produces: Sequence[str] = SERVED) -> bool:
    """go-restful ``matchesAccept``: a built-in route serves the request only if some Accept
    entry's bare type (parameters and q ignored) is one it produces, or is ``*/*``."""
    for entry in (accept or "*/*").split(","):
        mime = entry.split(";", 1)[0].strip(" ")
        if mime == "*/*" or mime in produces:
            return True
    return False


def parse_bool(text: str) -> bool | None:
    """Go's ``strconv.ParseBool``; None when it fails."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    return None


def is_pretty(pretty_param: str | None, user_agent: str | None) -> bool:
    """``isPrettyPrint``: ``?pretty=`` when given (unparsable means false), else a human client."""
    if pretty_param:
        return parse_bool(pretty_param) is True
    ua = user_agent or ""
    return ua.startswith(("curl", "Wget", "Mozilla/5.0"))


def media_type_of(content_type: str | None) -> str:
    """The bare media type of a Content-Type (lower-cased, parameters dropped) and whether a
    ``stream=watch`` parameter is present, as ``type;stream=watch``."""
    if not content_type:
        return ""
    base, _, rest = content_type.partition(";")
    # mime.ParseMediaType, as the apiserver reads Content-Type: strings.TrimSpace(strings.ToLower(base)),
    # so U+0130 is "i" and U+212A "k" to it (str.lower would make "application/json" with U+0130 another type).
    bare = trim_space(to_lower(base))
    for param in rest.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "stream" and value.strip().strip('"') == "watch":
            return bare + ";stream=watch"
    return bare
