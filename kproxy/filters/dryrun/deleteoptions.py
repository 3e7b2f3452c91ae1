"""A DELETE body's DeleteOptions, as the apiserver decodes it (JSON, YAML or protobuf by
Content-Type; its ``dryRun`` then wins over the query's), and the body rewritten with
``dryRun: ["All"]`` (JSON and YAML become JSON; protobuf is edited in its wire form)."""

from __future__ import annotations

from typing import Any

import orjson

from kproxy.codec.codecerrors import CodecError
from kproxy.codec.envelope import iter_fields, ld
from kproxy.filters.dryrun.query import DRY_RUN_ALL
from kproxy.gocompat.jsondepth import nesting_error
from kproxy.gocompat.jsonsyntax import syntax_error
from kproxy.gocompat.strings import to_lower, trim_space
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json

__all__ = [
    "DELETE_MEDIA_TYPES",
    "JSON",
    "PROTOBUF",
    "YAML",
    "BodyError",
    "NotJSON",
    "NotYAML",
    "UnsupportedBodyType",
    "decode_options",
    "delete_body_dry_run",
    "dry_run_field",
    "enforce_delete_body",
    "media_type",
]

# What metainternalversionscheme.Codecs decodes DeleteOptions from (negotiation.NegotiateInputSerializer).
JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
DELETE_MEDIA_TYPES = (JSON, YAML, PROTOBUF)
#: The protobuf envelope's magic number (k8s.io/apimachinery/pkg/runtime/serializer/protobuf).
PROTOBUF_ENVELOPE_PREFIX = b"k8s\x00"


class BodyError(Exception):
    """A DELETE body kproxy cannot read as DeleteOptions (so it cannot make it a dry run)."""


class UnsupportedBodyType(BodyError):
    """A DELETE body in a media type the apiserver does not decode DeleteOptions from."""


class NotJSON(BodyError):
    """A JSON DELETE body that is not JSON at all: the message is the apiserver's own 400 for it
    (Go's ``encoding/json`` syntax error, which its decoder meets before anything else)."""


class NotYAML(BodyError):
    """A YAML DELETE body go-yaml refuses (syntax, depth, aliasing): the message is its error."""


def media_type(content_type: str) -> str:
    """The lower-cased ``type/subtype`` of a Content-Type (parameters dropped); JSON when absent."""
    # mime.ParseMediaType: Go's ToLower then TrimSpace (U+0130 is "i" to it, not to str.lower).
    mt = trim_space(to_lower(content_type.split(";", 1)[0]))
    return mt or JSON


def decode_options(data: bytes, mt: str) -> Any:
    """The body as the apiserver's decoder sees it: YAML through sigs.k8s.io/yaml with go-yaml's
    limits (first document only; ``kproxy.gocompat.yaml``), then Go's JSON syntax check (its
    nesting limit included)."""
    if mt == YAML:
        try:
            decoded = yaml_to_json(data)
        except GoYAMLError as err:
            raise NotYAML(str(err)) from None
        except UnsupportedYAML as err:
            raise BodyError(f"the DeleteOptions body is not converted: {err}") from None
        too_deep = nesting_error(decoded.value, decoded.depth)
        if too_deep is not None:
            raise NotJSON(f"couldn't get version/kind; json parse error: {too_deep}")
        return decoded.value
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        go = syntax_error(data)
        if go is not None:
            raise NotJSON(f"couldn't get version/kind; json parse error: {go}") from None
        raise BodyError(f"the DeleteOptions body is not valid JSON: {err}") from None


def dry_run_field(options: dict[str, Any]) -> list[str] | None:
    values = options.get("dryRun")
    if values is None or values == []:
        return None  # absent, null and [] all mean "not a dry run" and are valid
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return ["<not a list of strings>"]
    return values


def delete_body_dry_run(data: bytes, content_type: str) -> list[str] | None:
    """The ``dryRun`` values of a DELETE body (``None`` when it has none); raises :class:`BodyError`."""
    mt = media_type(content_type)
    if mt == PROTOBUF:
        return _protobuf_dry_run(data)[1] or None
    if mt not in DELETE_MEDIA_TYPES:
        raise UnsupportedBodyType(mt)
    options = decode_options(data, mt)
    if options is None:
        return None
    if not isinstance(options, dict):
        raise BodyError("the DeleteOptions body is not an object")
    return dry_run_field(options)


def enforce_delete_body(data: bytes, content_type: str) -> tuple[bytes, str, list[str] | None]:
    """The body rewritten with ``dryRun: ["All"]``, its Content-Type, and the client's own values."""
    mt = media_type(content_type)
    if mt == PROTOBUF:
        edited, pb_values = _protobuf_dry_run(data, enforce=True)
        return edited, content_type, pb_values or None
    if mt not in DELETE_MEDIA_TYPES:
        raise UnsupportedBodyType(mt)
    options = decode_options(data, mt)
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BodyError("the DeleteOptions body is not an object")
    values = dry_run_field(options)
    # Drop case variants too: harmless for the apiserver (its decoder is case-sensitive), safe
    # against any case-insensitive decoder behind it.
    out = {k: v for k, v in options.items() if not (isinstance(k, str) and k.lower() == "dryrun")}
    out["dryRun"] = [DRY_RUN_ALL]
    try:
        return orjson.dumps(out), JSON, values
    except TypeError as err:
        raise BodyError(f"the DeleteOptions body cannot be represented as JSON: {err}") from None


def _fields(buf: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """Protobuf wire fields as (number, wire type, whole field bytes, payload)."""
    out = []
    try:
        for number, wire, start, value, end in iter_fields(buf):
            if number == 0:
                raise BodyError("malformed protobuf message: field number 0")
            out.append((number, wire, buf[start:end], buf[value:end] if wire == 2 else b""))
    except CodecError as err:
        raise BodyError(str(err)) from None
    return out


def _protobuf_dry_run(data: bytes, enforce: bool = False) -> tuple[bytes, list[str]]:
    """Read (and with ``enforce`` rewrite) ``dryRun`` (field 5) of a protobuf DeleteOptions.

    The body is the ``k8s\\0`` envelope around ``runtime.Unknown`` (typeMeta = 1, raw = 2,
    contentEncoding = 3, contentType = 4); ``raw`` is the DeleteOptions message, whose last
    occurrence wins as in Go's generated unmarshaller. Every field but ``dryRun`` is kept.
    """
    if not data.startswith(PROTOBUF_ENVELOPE_PREFIX):
        raise BodyError("the protobuf body does not start with the k8s envelope prefix")
    unknown = _fields(data[len(PROTOBUF_ENVELOPE_PREFIX) :])
    raws = [payload for number, wire, _, payload in unknown if number == 2 and wire == 2]
    raw = raws[-1] if raws else b""
    values: list[str] = []
    kept: list[bytes] = []
    for number, wire, whole, payload in _fields(raw):
        if number == 5:
            if wire != 2:
                values.append("<not a string>")
                continue
            try:
                values.append(payload.decode())
            except UnicodeDecodeError:
                values.append(payload.decode(errors="replace"))
            continue
        kept.append(whole)
    if not enforce:
        return data, values
    new_raw = b"".join(kept) + ld(5, DRY_RUN_ALL.encode())
    others = [whole for number, _, whole, _ in unknown if number != 2]
    return PROTOBUF_ENVELOPE_PREFIX + b"".join(others) + ld(2, new_raw), values
