"""The Kubernetes wire codec: protobuf envelope, objects, lists, watch frames, JSON and YAML.

An engine with no HTTP in it (the transcode filter adapts it). The schema is the
FileDescriptorSet of the Kubernetes API's generated.proto files plus their Go JSON tags, both
built by `make proto` and shipped in kproxy/codec/data/.

May import: ``kproxy.gocompat`` only (no aiohttp, no filter, no server).
"""

from .codec import ProtobufCodec, shared_codec
from .codecerrors import CodecError
from .envelope import MAGIC, Envelope, decode_envelope, encode_envelope
from .quantity import canonical_quantity
from .schema import Schema, load_schema
from .streams import ListTranscoder, WatchTranscoder
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
