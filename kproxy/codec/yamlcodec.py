"""YAML as the apiserver writes and reads it (sigs.k8s.io/yaml over go-yaml v2).

The apiserver's YAML is its JSON converted to YAML: map keys sorted, block style, sequences not
indented under their key. pyyaml's C dumper/loader (libyaml) does that at C speed.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import CodecError

try:
    _Base: Any = yaml.CSafeDumper
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - pyyaml built without libyaml
    _Base = yaml.SafeDumper
    _Loader = yaml.SafeLoader


class _Dumper(_Base):  # type: ignore[misc]
    """libyaml's emitter, with go-yaml's choice for multi-line strings (a literal `|` block)."""


def _str(dumper: Any, value: str) -> Any:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def to_yaml(obj: Any) -> bytes:
    """Python objects (e.g. ProtobufCodec.to_obj) -> YAML bytes, keys sorted."""
    out: bytes = yaml.dump(
        obj,
        Dumper=_Dumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 30,
        encoding="utf-8",
    )
    return out


def from_yaml(data: bytes | str) -> Any:
    """One YAML document -> Python objects; CodecError for malformed YAML."""
    try:
        return yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as e:
        raise CodecError(f"error converting YAML to JSON: {e}") from e
