"""Write the code kproxy generates at run time, for a typical configuration, as .py files.

    python -m kproxy.codegen --dump DIR

What a running kproxy would generate, driven here through each engine's own entry points:

* the protobuf codec's functions for every built-in kind of the embedded schema (``to_json``
  through the wire reader and the upb functions it leaves fields to, ``to_obj``), as the
  transcode and watch-cache filters use them;
* the watch cache's field-selector accessors of every built-in resource with selectable fields,
  and of the resources that have only ``metadata.name``/``metadata.namespace``;
* the validation filter's clean check for a sample schema (objects, lists, maps, an embedded
  resource and a recursive type, the shapes the generator handles differently).

Each file is named after its module (``kproxy.codec.wirejson.k8s.io.api.core.v1.Pod.py``); a
traceback's ``<generated kproxy.codec.wirejson:k8s.io.api.core.v1.Pod>`` line N is line N of it.
This module is the dump command only: it imports the engines, which import ``kproxy.codegen``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kproxy.cacher.fields import builtin_fields, builtin_resources
from kproxy.codec import CodecError, ProtobufCodec
from kproxy.codegen import dump
from kproxy.filters.validation.fastcheck import compile_clean
from kproxy.filters.validation.schemanodes import GroupVersionSchemas

_REF = "#/components/schemas/"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

# A custom resource's schema as the apiserver publishes it under /openapi/v3 (trimmed).
SAMPLE_SCHEMAS: dict[str, Any] = {
    _META: {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "ownerReferences": {
                "type": "array",
                "items": {"type": "object", "properties": {"kind": {"type": "string"}, "uid": {"type": "string"}}},
            },
        },
    },
    "com.example.v1.Props": {  # recursive, as JSONSchemaProps is
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "properties": {"type": "object", "additionalProperties": {"$ref": _REF + "com.example.v1.Props"}},
        },
    },
    "com.example.v1.Widget": {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"allOf": [{"$ref": _REF + _META}]},
            "spec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "ports": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "port": {"type": "integer"}},
                        },
                    },
                    "selector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "properties": {"spec": {"type": "object", "properties": {"image": {"type": "string"}}}},
                    },
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "schema": {"allOf": [{"$ref": _REF + "com.example.v1.Props"}]},
                },
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        },
    },
}


def generate_typical() -> list[str]:
    """Generate what a typical configuration generates; the kinds the codec refused (none
    expected), as ``apiVersion/kind: reason``."""
    refused: list[str] = []
    codec = ProtobufCodec()
    for group, version, kind in sorted(codec.schema.kinds):
        api_version = f"{group}/{version}" if group else version
        try:
            data = codec.from_json({"apiVersion": api_version, "kind": kind})
            codec.to_json(data)
            codec.to_obj(data)
        except CodecError as e:
            refused.append(f"{api_version}/{kind}: {e}")
    for group, resource in builtin_resources():
        builtin_fields(group, resource)
    builtin_fields("", "configmaps")  # a resource with metadata.name and metadata.namespace only
    sample = GroupVersionSchemas(custom=True, endpoints={}, schemas=SAMPLE_SCHEMAS)
    compile_clean(sample.node("com.example.v1.Widget"), "widgets.example.com.v1")
    return refused


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kproxy.codegen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dump", type=Path, required=True, metavar="DIR", help="write the generated modules here")
    args = ap.parse_args(argv)
    refused = generate_typical()
    for line in refused:
        print(f"not generated: {line}", file=sys.stderr)
    written = dump(args.dump)
    print(f"{len(written)} generated modules written to {args.dump}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
