"""The Kubernetes API schema: protobuf descriptors plus the Go JSON shape of every field.

Both files under data/ are built by `make proto` (tools/proto/build.sh) from the Kubernetes
modules of the control plane's release: kubernetes.binpb is the FileDescriptorSet of every
generated.proto; kubernetes-json.json holds the Go json/protobuf tags of the same types. At run
time the descriptors go into a private descriptor_pool and message classes come from
message_factory (upb), no generated _pb2 modules.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from .gotypes import META, GoType, GoTypes

TYPE_META = f"{META}.TypeMeta"

#: Fields that Go always writes (a non-pointer struct: in protobuf and in JSON, ``{}`` when empty) but
#: that an older supported minor's types lack, with the minor that added them: (message, JSON key) ->
#: minor. An apiserver of that minor or newer always sends such a field, one of an older minor never
#: does, so the codec writes it (both ways) only when the object carries it, and a watch bookmark
#: (the kind's zero value) has it only when the upstream's minor does. From comparing the Go JSON
#: tags of k8s.io/api v0.35 and v0.36 with the codec's (docs/compatibility.md); pointer, slice and
#: omitempty fields need nothing here, they are absent when empty in every minor.
NEWER_FIELDS: dict[tuple[str, str], int] = {
    ("k8s.io.api.storage.v1.CSINode", "status"): 37,
    ("k8s.io.api.storage.v1beta1.CSINode", "status"): 37,
}


@dataclass(frozen=True, slots=True)
class FieldPlan:
    """How one Go struct field maps between its proto field and its JSON key."""

    json: str  # JSON key ("" for an embedded, inlined struct)
    proto: FieldDescriptor
    go: GoType
    omitempty: bool
    omitzero: bool
    inline: bool
    #: The Kubernetes minor that added this field, when that is newer than the oldest minor kproxy
    #: supports and Go writes the field even when empty (:data:`NEWER_FIELDS`); else 0.
    since: int = 0


@dataclass(slots=True)
class MessagePlan:
    """A message's fields in Go declaration order (the apiserver's JSON key order)."""

    descriptor: Descriptor
    go_name: str
    fields: list[FieldPlan] = field(default_factory=list)
    has_type_meta: bool = False


class Schema:
    """Descriptors, message classes, Go shapes and the (group, version, kind) index."""

    def __init__(self, descriptor_set: bytes, go_packages: dict[str, Any]) -> None:
        fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        self.pool = descriptor_pool.DescriptorPool()
        go_pkg_of: dict[str, str] = {}
        for fd in fds.file:
            self.pool.Add(fd)
            go_pkg_of[fd.package] = fd.options.go_package
        self.go = GoTypes(go_packages)
        self._classes: dict[str, type[Message]] = {}
        self._plans: dict[str, MessagePlan] = {}
        self.message_of_go: dict[str, str] = {}
        self.go_of_message: dict[str, str] = {}
        # (group, version, kind) -> message full name, for kinds (structs that embed TypeMeta).
        self.kinds: dict[tuple[str, str, str], str] = {}
        self.meta_kinds: dict[str, str] = {}
        for fd in fds.file:
            go_pkg = go_pkg_of[fd.package]
            group = self.go.groups.get(go_pkg, "")
            version = go_pkg.rsplit("/", 1)[-1]
            for msg in fd.message_type:
                full = f"{fd.package}.{msg.name}"
                go_name = f"{go_pkg}.{msg.name}"
                self.message_of_go[go_name] = full
                self.go_of_message[full] = go_name
                fields = self.go.struct_fields(go_name) or []
                if any(f.get("type") == TYPE_META and f.get("embedded") for f in fields):
                    self.kinds[(group, version, msg.name)] = full
                    if go_pkg == META:
                        self.meta_kinds[msg.name] = full

    def message_class(self, full_name: str) -> type[Message]:
        cls = self._classes.get(full_name)
        if cls is None:
            cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))
            self._classes[full_name] = cls
        return cls

    def lookup_kind(self, api_version: str, kind: str) -> str | None:
        """The message for apiVersion/kind; meta/v1 kinds (Status, WatchEvent...) in any group."""
        group, _, version = api_version.rpartition("/")
        full = self.kinds.get((group, version, kind))
        if full is None and version in ("v1", ""):
            full = self.meta_kinds.get(kind)
        return full

    def plan(self, full_name: str) -> MessagePlan:
        """The field plan of a message, built once."""
        plan = self._plans.get(full_name)
        if plan is not None:
            return plan
        desc = self.pool.FindMessageTypeByName(full_name)
        go_name = self.go_of_message.get(full_name, "")
        plan = MessagePlan(descriptor=desc, go_name=go_name)
        go_fields = self.go.struct_fields(go_name)
        by_number = desc.fields_by_number
        if go_fields is None:
            # No Go struct (should not happen for API types): fall back to the proto fields.
            for f in desc.fields:
                plan.fields.append(FieldPlan(f.json_name, f, GoType("other"), True, False, False))
        else:
            for gf in go_fields:
                if gf.get("type") == TYPE_META:
                    plan.has_type_meta = True
                    continue
                num = gf.get("proto")
                if not num or gf.get("skip") or num not in by_number:
                    continue
                plan.fields.append(
                    FieldPlan(
                        json=gf["json"],
                        proto=by_number[num],
                        go=self.go.resolve(gf["type"]),
                        omitempty=bool(gf.get("omitempty")),
                        omitzero=bool(gf.get("omitzero")),
                        inline=bool(gf.get("embedded")) and gf["json"] == "",
                        since=NEWER_FIELDS.get((full_name, gf["json"]), 0),
                    )
                )
        self._plans[full_name] = plan
        return plan


@functools.cache
def load_schema() -> Schema:
    """The schema shipped as package data (cached: building it takes a few hundred ms)."""
    data = importlib.resources.files("kproxy.codec") / "data"
    descriptor_set = (data / "kubernetes.binpb").read_bytes()
    go_packages = json.loads((data / "kubernetes-json.json").read_bytes())
    return Schema(descriptor_set, go_packages)
