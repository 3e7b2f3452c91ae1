"""The custom resource definitions the corpus writes to."""

from __future__ import annotations

from typing import Any

GROUP = "validation.kproxy.test"

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer"},
                "title": {"type": "string"},
                "port": {"x-kubernetes-int-or-string": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "slots": {
                    "type": "object",
                    "additionalProperties": {"type": "object", "properties": {"v": {"type": "string"}}},
                },
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"a": {"type": "string"}, "n": {"type": "integer", "nullable": True}},
                    },
                },
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"known": {"type": "object", "properties": {"x": {"type": "string"}}}},
                },
                "embedded": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object", "properties": {"q": {"type": "string"}}}},
                },
                "anything": {"x-kubernetes-preserve-unknown-fields": True},
                "maybe": {"type": "string", "nullable": True},
            },
        },
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    },
}

GADGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {"spec": {"type": "object", "properties": {"mode": {"type": "string"}}}},
}


def crd(plural: str, kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }


CRDS = [crd("widgets", "Widget", WIDGET_SCHEMA), crd("gadgets", "Gadget", GADGET_SCHEMA)]
