"""Differential harness for the watch cache: the same LIST/GET straight to the apiserver and
through kproxy, and a precise account of every difference.

What may differ and what may not (the apiserver's semantics for get and list,
docs/using/watchcache.md):

* status code, ``Content-Type``, ``Retry-After``: always equal;
* error bodies (``Status``): byte-equal, except the ``current: M`` of "Too large resource version"
  (M is the resource version the answering cache has reached, which is kproxy's own);
* list items: equal parsed AND byte-equal as the apiserver encodes them (JSON items, YAML document
  up to the list's own metadata, protobuf item messages), in the same order, as long as nothing was
  written in between (the population is static while a comparison runs);
* ``metadata.continue``: presence only (kproxy issues its own tokens); ``remainingItemCount``: equal;
* ``metadata.resourceVersion`` of the list: checked against what the request asked for rather than
  compared (a cache may legitimately answer at another valid version): ``Exact`` semantics -> the
  requested N on both sides; ``NotOlderThan`` N -> at least N; a consistent read (unset) -> at least
  what the apiserver said just before; ``0`` -> any.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from corpus.compare import JSON, PROTOBUF, YAML, Answer, Sides
from prometheus_client.parser import text_string_to_metric_families

from kproxy.codec import MAGIC, ProtobufCodec
from kproxy.gocompat.yaml import yaml_to_json

__all__ = [
    "JSON",
    "PROTOBUF",
    "YAML",
    "ListView",
    "Mismatches",
    "Semantics",
    "compare_answers",
    "first_values",
    "gather_limited",
    "list_view",
    "load_yaml",
    "query_path",
    "reads_total",
    "semantics_of",
]

#: The Status message part that names the answering cache's own resource version.
_CURRENT_RV = re.compile(rb"(Too large resource version: \d+, current: )\d+")

_codec: ProtobufCodec | None = None


def load_yaml(text: str | bytes) -> Any:
    """YAML as go-yaml writes it (kubectl -o yaml, the apiserver's application/yaml), read as the
    apiserver reads it: a plain ``=`` or ``<<`` is a string, and so are digits too many for a
    float64, which go-yaml writes unquoted."""
    return yaml_to_json(text).value


def codec() -> ProtobufCodec:
    """One ProtobufCodec for the harness (loading the schema is not free)."""
    global _codec
    if _codec is None:
        _codec = ProtobufCodec()
    return _codec


def query_path(base: str, params: Sequence[tuple[str, str]]) -> str:
    return f"{base}?{urlencode(list(params))}" if params else base


# --------------------------------------------------------------------------- protobuf wire format


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def pb_fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) in wire order; enough of protobuf for lists and Status."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(data, pos)
            out.append((num, wt, v))
        elif wt == 2:
            n, pos = _varint(data, pos)
            out.append((num, wt, data[pos : pos + n]))
            pos += n
        elif wt == 1:
            out.append((num, wt, data[pos : pos + 8]))
            pos += 8
        elif wt == 5:
            out.append((num, wt, data[pos : pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wt} at {pos}")
    return out


# --------------------------------------------------------------------------- a LIST body, parsed


@dataclass
class ListView:
    """A list response taken apart: what must be equal, and the list metadata checked separately."""

    kind: str
    resource_version: str | None
    continue_token: str | None
    remaining: int | None
    items: list[Any]
    #: The bytes that must be equal on both sides: the items as encoded (and, for JSON/YAML, the
    #: document around them with the list's own resourceVersion/continue masked).
    raw_items: list[bytes]
    raw_frame: bytes


def _json_list(body: bytes) -> ListView:
    doc = json.loads(body)
    meta = doc.get("metadata") or {}
    # Compact (`,"items":[`) or pretty-printed (`,\n  "items": [`); `null` for a transformed empty list.
    parts = re.split(rb',(\s*)"items":(\s*)(?=\[|null)', body, maxsplit=1)
    if len(parts) != 4:
        raise ValueError(f"no items array in {body[:200]!r}")
    head, tail = parts[0], b"".join(parts[1:])
    if head.lstrip(b"{ \n").startswith(b'"apiVersion"'):
        # Unstructured (custom resource) lists sort their keys: the list's own metadata comes
        # after the items, as the last key.
        cut = [m.start() for m in re.finditer(rb'\]\s*,\s*"kind":', tail)]
        if cut:
            head, tail = head + tail[cut[-1] :], tail[: cut[-1]]
    head = re.sub(rb'"resourceVersion":(\s*)"[^"]*"', rb'"resourceVersion":\1"RV"', head)
    head = re.sub(rb'"continue":(\s*)"[^"]*"', rb'"continue":\1"TOKEN"', head)
    return ListView(
        kind=doc.get("kind", ""),
        resource_version=meta.get("resourceVersion"),
        continue_token=meta.get("continue"),
        remaining=meta.get("remainingItemCount"),
        items=doc.get("items"),
        raw_items=[tail],
        raw_frame=head,
    )


def _yaml_list(body: bytes) -> ListView:
    doc = load_yaml(body)
    meta = doc.get("metadata") or {}
    # Keys are sorted (apiVersion, items, kind, metadata): the list's own metadata is the last
    # top-level block, everything before it must be byte-equal.
    cut = body.rfind(b"\nmetadata:")
    before, after = body[: cut + 1], body[cut + 1 :]
    after = re.sub(rb'(?m)^  resourceVersion: "?[^"\n]*"?$', b"  resourceVersion: RV", after)
    after = re.sub(rb"(?m)^  continue: .*$", b"  continue: TOKEN", after)
    return ListView(
        kind=doc.get("kind", ""),
        resource_version=meta.get("resourceVersion"),
        continue_token=meta.get("continue"),
        remaining=meta.get("remainingItemCount"),
        items=doc.get("items"),
        raw_items=[before],
        raw_frame=after,
    )


def _protobuf_list(body: bytes) -> ListView:
    if not body.startswith(MAGIC):
        raise ValueError(f"no protobuf magic in {body[:40]!r}")
    envelope = pb_fields(body[len(MAGIC) :])
    raw = next(v for n, _, v in envelope if n == 2)
    assert isinstance(raw, bytes)
    list_fields = pb_fields(raw)
    list_meta = next((v for n, _, v in list_fields if n == 1), b"")
    assert isinstance(list_meta, bytes)
    meta: dict[int, bytes | int] = {n: v for n, _, v in pb_fields(list_meta)}
    items = [v for n, _, v in list_fields if n == 2]
    # The frame: the envelope's fields other than raw, the list's field layout, the ListMeta's field
    # layout with resourceVersion (2) and continue (3) masked.
    frame = repr(
        (
            [(n, wt, v) for n, wt, v in envelope if n != 2],
            [(n, wt) for n, wt, _ in list_fields],
            [(n, wt, v if n not in (2, 3) else bool(v)) for n, wt, v in pb_fields(list_meta)],
        )
    ).encode()
    decoded = codec().to_obj(body)

    def text(n: int) -> str | None:
        v = meta.get(n)
        return v.decode() if isinstance(v, bytes) and v else None

    remaining = meta.get(4)
    return ListView(
        kind=decoded.get("kind", ""),
        resource_version=text(2),
        continue_token=text(3),
        remaining=remaining if isinstance(remaining, int) else None,
        items=decoded.get("items") or [],
        raw_items=[v for v in items if isinstance(v, bytes)],
        raw_frame=frame,
    )


def list_view(answer: Answer) -> ListView:
    ct = answer.content_type.split(";")[0].strip()
    if ct == JSON:
        return _json_list(answer.body)
    if ct == YAML:
        return _yaml_list(answer.body)
    if ct == PROTOBUF:
        return _protobuf_list(answer.body)
    raise ValueError(f"unexpected Content-Type {answer.content_type!r}")


def item_names(view: ListView) -> list[str]:
    return [
        f"{(i.get('metadata') or {}).get('namespace', '')}/{(i.get('metadata') or {}).get('name')}"
        for i in view.items or ()  # a transformed empty list's items are null
    ]


# --------------------------------------------------------------------------- which resourceVersion a list may carry


@dataclass(frozen=True)
class Semantics:
    """What the seeds' table says about the list's resourceVersion for one request."""

    kind: str  # "consistent" | "any" | "exact" | "not-older-than" | "continue" | "invalid"
    rv: int | None = None


def first_values(params: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Query parameters as the apiserver reads them: the first of repeated values wins."""
    out: dict[str, str] = {}
    for k, v in params:
        out.setdefault(k, v)
    return out


def semantics_of(params: Mapping[str, str]) -> Semantics:
    rv = params.get("resourceVersion") or None  # an empty value is an unset one
    rvm = params.get("resourceVersionMatch") or None
    if "continue" in params:
        return Semantics("continue")
    if rvm not in (None, "Exact", "NotOlderThan"):
        return Semantics("invalid")
    if rv is None:
        return Semantics("consistent" if rvm is None else "invalid")
    if rv == "0":
        return Semantics("invalid" if rvm == "Exact" else "any")
    if not rv.isdigit():
        return Semantics("invalid")
    limit = params.get("limit", "")
    paged = limit.isdigit() and int(limit) > 0  # limit=0 or -1: no limit
    if rvm == "Exact" or (rvm is None and paged):
        return Semantics("exact", int(rv))
    return Semantics("not-older-than", int(rv))


def _int_rv(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


# --------------------------------------------------------------------------- comparing two answers


@dataclass
class Mismatches:
    """Every difference found, each naming the request, what the apiserver said and what kproxy said."""

    found: list[str] = field(default_factory=list)

    def add(self, request: str, what: str, direct: object, proxied: object) -> None:
        self.found.append(f"{request}: {what}: apiserver={_short(direct)} kproxy={_short(proxied)}")

    def extend(self, other: Mismatches) -> None:
        self.found.extend(other.found)

    def report(self, limit: int = 60) -> str:
        shown = "\n".join(self.found[:limit])
        more = f"\n... and {len(self.found) - limit} more" if len(self.found) > limit else ""
        return f"{len(self.found)} disagreement(s) between the apiserver and kproxy:\n{shown}{more}"

    def __bool__(self) -> bool:
        return bool(self.found)


def _short(value: object, limit: int = 600) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[:limit] + f"...(+{len(text) - limit})"


def _first_difference(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, n - 80), n + 120
    return f"first difference at byte {n} of {len(a)}/{len(b)}: apiserver ...{a[lo:hi]!r} kproxy ...{b[lo:hi]!r}"


def _status_equal(direct: Answer, proxied: Answer) -> tuple[bool, str]:
    """Error bodies byte-equal, the "current: M" of a too-large resource version aside."""
    if direct.body == proxied.body:
        return True, ""
    a, b = (_CURRENT_RV.sub(rb"\1M", x.body) for x in (direct, proxied))
    if direct.content_type.startswith(PROTOBUF) and _CURRENT_RV.search(direct.body):
        # A different number of digits changes the length prefixes: compare decoded instead.
        try:
            da, db = (json.dumps(codec().to_obj(x.body), sort_keys=True).encode() for x in (direct, proxied))
        except Exception as err:  # kproxy's body may be anything; that is the finding
            return False, f"undecodable protobuf Status: {err}"
        a, b = _CURRENT_RV.sub(rb"\1M", da), _CURRENT_RV.sub(rb"\1M", db)
    if a == b:
        return True, ""
    return False, _first_difference(a, b)


def compare_answers(
    request: str,
    direct: Answer,
    proxied: Answer,
    params: Mapping[str, str],
    *,
    is_list: bool = True,
) -> Mismatches:
    """Compare one request's two answers; ``direct`` must have been sent first (consistent reads)."""
    out = Mismatches()
    if direct.status != proxied.status:
        out.add(request, "status", direct.status, proxied.status)
        out.add(request, "body", direct.body[:400], proxied.body[:400])
        return out
    if direct.content_type != proxied.content_type:
        out.add(request, "Content-Type", direct.content_type, proxied.content_type)
    # Cache-Control ("no-cache, private") keeps shared HTTP caches from keeping secrets; Audit-Id and
    # the flow-control UIDs belong to an apiserver request, which a cached read is not.
    for header in ("Retry-After", "Content-Encoding", "Vary", "Warning", "Cache-Control"):
        if direct.headers.getall(header, []) != proxied.headers.getall(header, []):
            out.add(request, f"header {header}", direct.headers.getall(header, []), proxied.headers.getall(header, []))
    if direct.status != 200:
        ok, why = _status_equal(direct, proxied)
        if not ok:
            out.add(request, f"Status body ({why})", direct.body, proxied.body)
        return out
    if not is_list:
        if direct.body != proxied.body:
            out.add(request, f"object body ({_first_difference(direct.body, proxied.body)})", "", "")
        return out
    try:
        dv = list_view(direct)
    except Exception as err:
        out.add(request, f"harness cannot parse the apiserver's list ({err})", direct.body[:300], "")
        return out
    try:
        pv = list_view(proxied)
    except Exception as err:
        out.add(request, f"kproxy's list body does not parse ({err})", direct.body[:300], proxied.body[:300])
        return out
    if dv.kind != pv.kind:
        out.add(request, "kind", dv.kind, pv.kind)
    dn, pn = item_names(dv), item_names(pv)
    if dn != pn:
        out.add(request, f"item names in order ({len(dn)} vs {len(pn)})", dn, pn)
    elif dv.items != pv.items:
        bad = next(i for i, (x, y) in enumerate(zip(dv.items, pv.items, strict=True)) if x != y)
        out.add(request, f"parsed item {dn[bad]}", dv.items[bad], pv.items[bad])
    if dv.raw_items != pv.raw_items:
        if len(dv.raw_items) == len(pv.raw_items):
            bad = next(i for i, (x, y) in enumerate(zip(dv.raw_items, pv.raw_items, strict=True)) if x != y)
            what = _first_difference(dv.raw_items[bad], pv.raw_items[bad])
            if len(dv.raw_items) > 1:
                what = f"item #{bad} {dn[bad] if bad < len(dn) else ''}: {what}"
        else:
            what = f"{len(dv.raw_items)} vs {len(pv.raw_items)} encoded items"
        out.add(request, f"encoded items not byte-equal ({what})", "", "")
    if dv.raw_frame != pv.raw_frame:
        out.add(request, "list envelope/metadata layout", dv.raw_frame[-300:], pv.raw_frame[-300:])
    if (dv.continue_token is None) != (pv.continue_token is None):
        out.add(request, "metadata.continue present", dv.continue_token is not None, pv.continue_token is not None)
    if dv.remaining != pv.remaining:
        out.add(request, "metadata.remainingItemCount", dv.remaining, pv.remaining)
    out.extend(_check_rv(request, semantics_of(params), dv, pv))
    return out


def _check_rv(request: str, sem: Semantics, dv: ListView, pv: ListView) -> Mismatches:
    out = Mismatches()
    d, p = _int_rv(dv.resource_version), _int_rv(pv.resource_version)
    if d is None:
        out.add(request, "harness: the apiserver's list has no numeric resourceVersion", dv.resource_version, "")
        return out
    if p is None:
        out.add(request, "metadata.resourceVersion is not a resource version", dv.resource_version, pv.resource_version)
        return out
    if sem.kind == "exact" and (d != sem.rv or p != sem.rv):
        out.add(request, f"metadata.resourceVersion for Exact {sem.rv}", d, p)
    elif sem.kind == "not-older-than" and sem.rv is not None and p < sem.rv:
        out.add(request, f"metadata.resourceVersion older than the requested {sem.rv}", d, p)
    elif sem.kind == "consistent" and p < d:
        out.add(request, "consistent read older than the apiserver's answer given just before", d, p)
    return out


# --------------------------------------------------------------------------- running many comparisons


async def gather_limited(coros: Iterable[Awaitable[Mismatches]], limit: int) -> Mismatches:
    """Run comparisons concurrently (the 3 s waits of future resource versions overlap)."""
    sem = asyncio.Semaphore(limit)
    total = Mismatches()

    async def one(c: Awaitable[Mismatches]) -> Mismatches:
        async with sem:
            return await c

    for m in await asyncio.gather(*(one(c) for c in coros)):
        total.extend(m)
    return total


async def diff(
    sides: Sides,
    path: str,
    params: Sequence[tuple[str, str]],
    *,
    accept: str = JSON,
    is_list: bool = True,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
) -> Mismatches:
    """The request straight to the apiserver, then through kproxy, compared (gzip bodies decoded;
    whether each side compressed is compared as a header)."""
    full = query_path(path, params)
    # The semantics come from the whole query, the part written into ``path`` included (a test may
    # write it there to control its encoding, e.g. %20 in a selector).
    params = [*parse_qsl(path.partition("?")[2]), *params]

    async def send(via_proxy: bool) -> Answer:
        answer = await sides.request(method, full, via_proxy=via_proxy, accept=accept, headers=dict(headers or {}))
        if answer.headers.get("Content-Encoding") == "gzip":
            return Answer(answer.status, answer.headers, gzip.decompress(answer.body))
        return answer

    if is_list and semantics_of(first_values(params)).kind == "consistent":
        # kproxy's answer must not be older than the apiserver's given before it.
        direct = await send(False)
        proxied = await send(True)
    else:  # side by side: the 3 s waits for a future resourceVersion overlap
        direct, proxied = await asyncio.gather(send(False), send(True))
    extra = "".join(f" [{k}: {v}]" for k, v in (headers or {}).items())
    label = f"{method} {full} [Accept: {accept}]{extra}"
    return compare_answers(label, direct, proxied, first_values(params), is_list=is_list)


# --------------------------------------------------------------------------- kproxy's metrics


def reads_total(metrics_text: str, *, resource: str, verb: str, served: str) -> float:
    """Sum of kproxy_watchcache_reads_total{resource,verb,served} over every reason."""
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name != "kproxy_watchcache_reads_total":
                continue
            labels = sample.labels
            if labels.get("resource") == resource and labels.get("verb") == verb and labels.get("served") == served:
                total += sample.value
    return total
