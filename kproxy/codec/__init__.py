"""The Kubernetes wire codec: protobuf envelope, objects, lists, watch frames, JSON and YAML.

An engine with no HTTP in it (the transcode filter adapts it). The schema is the
FileDescriptorSet of the Kubernetes API's generated.proto files plus their Go JSON tags, both
built by `make proto` and shipped in kproxy/codec/data/.

May import: ``kproxy.gocompat`` only (no aiohttp, no filter, no server).
"""

from typing import TYPE_CHECKING, Any

from .codec import ProtobufCodec, shared_codec
from .codecerrors import CodecError
from .envelope import MAGIC, Envelope, decode_envelope, encode_envelope
from .quantity import canonical_quantity
from .schema import Schema, load_schema
from .streams import ListTranscoder, WatchTranscoder

if TYPE_CHECKING:
    from .yamlcodec import from_yaml, to_yaml

__all__ = [
    "MAGIC",
    "CodecError",
    "Envelope",
    "ListTranscoder",
    "ProtobufCodec",
    "Schema",
    "WatchTranscoder",
    "canonical_quantity",
    "decode_envelope",
    "encode_envelope",
    "from_yaml",
    "load_schema",
    "shared_codec",
    "to_yaml",
]


def __getattr__(name: str) -> Any:
    # lazy: YAML (kproxy.gocompat.yaml and its tables) loads with the first YAML answer, not before
    # kproxy listens (tests/unit/test_start_imports.py)
    if name in ("from_yaml", "to_yaml"):
        from . import yamlcodec

        return getattr(yamlcodec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
