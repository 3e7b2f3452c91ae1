"""The Go shape of Kubernetes API fields, read from tools/proto's jsontags output.

Kubernetes' JSON is encoding/json applied to Go structs decoded from protobuf, so what a field
looks like in JSON depends on its Go type, not on its .proto declaration: a nil pointer, slice or
map is `null` unless tagged omitempty, a non-pointer struct is always printed, an embedded
",inline" struct is flattened into its parent. This module turns a Go type string such as
"*k8s.io/apimachinery/pkg/apis/meta/v1.Time" into a small tree the code generators consume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

META = "k8s.io/apimachinery/pkg/apis/meta/v1"
RUNTIME = "k8s.io/apimachinery/pkg/runtime"
APIEXT = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
APIEXT_BETA = "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"

# Go types with their own MarshalJSON (or a proto shape unlike their JSON): name -> special kind.
SPECIAL: dict[str, str] = {
    f"{META}.Time": "time",
    f"{META}.MicroTime": "microtime",
    f"{META}.Duration": "duration",
    f"{META}.FieldsV1": "rawjson",
    "k8s.io/apimachinery/pkg/api/resource.Quantity": "quantity",
    "k8s.io/apimachinery/pkg/util/intstr.IntOrString": "intorstring",
    f"{RUNTIME}.RawExtension": "rawext",
    f"{RUNTIME}.Unknown": "rawjson",
}
for _pkg in (APIEXT, APIEXT_BETA):
    SPECIAL[f"{_pkg}.JSON"] = "rawjson"
    SPECIAL[f"{_pkg}.JSONSchemaPropsOrBool"] = "schemaorbool"
    SPECIAL[f"{_pkg}.JSONSchemaPropsOrArray"] = "schemaorarray"
    SPECIAL[f"{_pkg}.JSONSchemaPropsOrStringArray"] = "schemaorstringarray"

SCALARS = {
    "string",
    "bool",
    "int",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "byte",
}


@dataclass(frozen=True, slots=True)
class GoType:
    """kind: scalar | bytes | ptr | slice | map | struct | special | other; name: the named type."""

    kind: str
    name: str = ""
    elem: GoType | None = None
    key: GoType | None = None


class GoTypes:
    """All named Go types of the API packages, by "importpath.Name"."""

    def __init__(self, packages: dict[str, Any]) -> None:
        self.named: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, str] = {}
        for path, pkg in packages.items():
            self.groups[path] = pkg["group"]
            for name, typ in pkg["types"].items():
                self.named[f"{path}.{name}"] = typ

    def struct_fields(self, name: str) -> list[dict[str, Any]] | None:
        typ = self.named.get(name)
        if typ is None or "underlying" in typ:
            return None
        fields: list[dict[str, Any]] = typ.get("fields") or []
        return fields

    def resolve(self, spec: str) -> GoType:
        """Parse a rendered Go type expression, following named non-struct types."""
        if spec.startswith("*"):
            return GoType("ptr", elem=self.resolve(spec[1:]))
        if spec == "[]byte" or spec == "[]uint8":
            return GoType("bytes")
        if spec.startswith("[]"):
            return GoType("slice", elem=self.resolve(spec[2:]))
        if spec.startswith("map["):
            depth, i = 0, 3
            for i in range(3, len(spec)):
                if spec[i] == "[":
                    depth += 1
                elif spec[i] == "]":
                    depth -= 1
                    if depth == 0:
                        break
            return GoType("map", key=self.resolve(spec[4:i]), elem=self.resolve(spec[i + 1 :]))
        if spec in SCALARS:
            return GoType("scalar", name=spec)
        if spec in SPECIAL:
            return GoType("special", name=SPECIAL[spec])
        typ = self.named.get(spec)
        if typ is None:
            return GoType("other", name=spec)
        if "underlying" in typ:
            under = self.resolve(typ["underlying"])
            # A named slice (ExtraValue, Verbs...) keeps its name: its .proto is a message with `items`.
            return GoType(under.kind, name=spec, elem=under.elem, key=under.key)
        return GoType("struct", name=spec)
