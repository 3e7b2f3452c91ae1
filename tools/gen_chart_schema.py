#!/usr/bin/env python3
"""Generate the ``config`` part of the Helm chart's values.schema.json from kproxy's own models.

The chart's ``config:`` value becomes kproxy's config file, so the chart must refuse at install
time what kproxy would refuse at start-up (a pod that crash-loops on ``credentails: proxy`` is
the failure this prevents). The schema is written from the same pydantic models kproxy
validates with (kproxy/config.py ``Config`` and each built-in filter's ``config_model``, as
tools/gen_filter_docs.py writes docs/filters.md from them): unknown keys, types, enums, bounds
and required keys come from the models; each ``filters:`` entry is checked against its filter's
model, chosen by ``name``, and an unknown name is refused.

What a model checks in Python code, the schema cannot derive. Each such check is stated here
once, next to the code it mirrors: the before-validators (durations, ``HOST:PORT`` listeners,
comma-separated regexp lists) get the JSON form of what they accept, and the field validators
get a pattern or keyword (``OVERLAYS``); a before-validator this tool does not know stops it,
so a new one cannot slip through unchecked. Checks across keys (a filter listed twice,
``proxy:`` outside ``credentials: proxy``) are made by the chart's templates (_helpers.tpl
``kproxy.validate``).

Only ``properties.config`` of the schema file is generated; the rest (the chart's own values)
is written by hand. ``--check`` (tests/e2e/test_helm.py) fails when the committed file differs.

Usage: gen_chart_schema.py [--check] [--plugins] [--output deploy/helm/kproxy/values.schema.json]
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "deploy" / "helm" / "kproxy" / "values.schema.json"

#: kproxy.config.parse_duration's regular expression (a number of seconds, or with ms/s/m/h).
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"
#: kproxy.config.split_hostport: HOST:PORT or [v6]:PORT, the port 0-65535 (checked by range
#: below as far as a pattern can: one to five digits).
HOSTPORT_PATTERN = r"^.*:[0-9]{1,5}$"
#: kproxy.filters.watchcache.resources.parse_name: "*", RESOURCE or RESOURCE.GROUP (one
#: non-empty part), v1/RESOURCE, or GROUP/VERSION/RESOURCE.
WATCHCACHE_RESOURCE_PATTERN = r"^([^/]+|v1/[^/]*|[^/]*/[^/]*/[^/]*)$"

#: Field validators written in Python, as JSON Schema: (model name, field) -> keywords merged
#: into the field's schema. tests/e2e/test_helm.py checks each against kproxy on examples.
OVERLAYS: dict[tuple[str, str], dict[str, Any]] = {
    ("WatchCacheSettings", "resources"): {"items": {"type": "string", "pattern": WATCHCACHE_RESOURCE_PATTERN}},
    ("PersistSettings", "resources"): {"items": {"type": "string", "pattern": WATCHCACHE_RESOURCE_PATTERN}},
    ("PersistSettings", "sensitive"): {"items": {"type": "string", "pattern": WATCHCACHE_RESOURCE_PATTERN}},
    ("CompressionSettings", "encodings"): {"uniqueItems": True},
}

_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


class ChartSchema(GenerateJsonSchema):
    """pydantic's validation-mode schema, with kproxy's before-validators in their JSON form."""

    def function_before_schema(self, schema: core_schema.BeforeValidatorFunctionSchema) -> JsonSchemaValue:
        name = getattr(schema["function"]["function"], "__name__", "")
        inner = self.generate_inner(schema["schema"])
        if name == "parse_duration":
            return {"anyOf": [inner, {"type": "string", "pattern": DURATION_PATTERN}]}
        if name == "_listen":
            return {"anyOf": [{"type": "string", "pattern": HOSTPORT_PATTERN}, inner]}
        if name == "_regexp_list":
            return {"anyOf": [inner, {"type": "string"}]}
        raise SystemExit(
            f"gen_chart_schema: unknown before-validator {name!r}: say in tools/gen_chart_schema.py what it accepts"
        )


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve every ``$ref`` (the models are not recursive), so the subtree stands anywhere."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline({**target, **rest}, defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _tidy(node: Any) -> Any:
    """Drop pydantic's titles and defaults (helm does not apply them), spell bounds pydantic
    left as ``ge``/``gt`` as JSON Schema keywords."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "properties" and isinstance(v, dict):
                out[k] = {name: _tidy(prop) for name, prop in v.items()}
                continue
            if k in ("title", "default"):
                continue
            numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
            key = str(k)
            out[_BOUNDS.get(key, key) if numeric else key] = _tidy(v)
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def _overlay(schema: dict[str, Any], applied: set[tuple[str, str]]) -> dict[str, Any]:
    """Apply OVERLAYS to the models in ``schema`` (the top one and its ``$defs``, by title),
    adding each one applied to ``applied``."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            title = node.get("title")
            for (owner, field), extra in OVERLAYS.items():
                if owner == title and field in node.get("properties", {}):
                    prop = node["properties"][field]
                    for k, v in extra.items():
                        prop[k] = {**prop.get(k, {}), **v} if isinstance(v, dict) else v
                    applied.add((owner, field))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


def model_schema(model: type[BaseModel], applied: set[tuple[str, str]]) -> dict[str, Any]:
    raw = _overlay(model.model_json_schema(schema_generator=ChartSchema), applied)
    result: dict[str, Any] = _tidy(_inline(raw, raw.get("$defs", {})))
    return result


def filters_schema(names: dict[str, type[BaseModel]], applied: set[tuple[str, str]]) -> dict[str, Any]:
    """``filters:``: each entry a known ``name`` plus exactly that filter's settings."""
    branches = []
    for name, model in sorted(names.items()):
        settings = model_schema(model, applied)
        then: dict[str, Any] = {
            "properties": {"name": {"const": name}, **settings.get("properties", {})},
            "additionalProperties": False,
        }
        if settings.get("required"):
            then["required"] = settings["required"]
        branches.append({"if": {"properties": {"name": {"const": name}}, "required": ["name"]}, "then": then})
    return {
        "type": "array",
        "description": "The filter chain, in order (docs/filters.md): each entry a filter's name and its settings.",
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"enum": sorted(names)}},
            "allOf": branches,
        },
    }


def filter_models(plugins: bool) -> dict[str, type[BaseModel]]:
    from kproxy.filters import BUILTIN, available, lookup

    names = available() if plugins else BUILTIN
    return {name: lookup(name).config_model for name in names}


def config_schema(plugins: bool = False) -> dict[str, Any]:
    from kproxy.config import Config

    applied: set[tuple[str, str]] = set()
    schema = model_schema(Config, applied)
    schema["properties"]["filters"] = filters_schema(filter_models(plugins), applied)
    if missing := set(OVERLAYS) - applied:
        raise SystemExit(f"gen_chart_schema: OVERLAYS name fields no model has any more: {sorted(missing)}")
    schema["description"] = (
        "The kproxy config (config.example.yaml), checked against kproxy's own models: generated by "
        "tools/gen_chart_schema.py, do not edit."
    )
    return {"description": schema.pop("description"), **schema}


def generate(current: dict[str, Any], plugins: bool = False) -> str:
    """``current`` (the schema file's JSON) with ``properties.config`` regenerated."""
    sys.path.insert(0, str(REPO))
    properties = dict(current["properties"])
    properties["config"] = config_schema(plugins)
    return json.dumps({**current, "properties": properties}, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the file differs from the generated text")
    ap.add_argument(
        "--plugins",
        action="store_true",
        help="also accept the filters installed from the kproxy.filters entry points (an image with plugins)",
    )
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    current_text = args.output.read_text()
    text = generate(json.loads(current_text), args.plugins)
    if args.check:
        if current_text != text:
            diff = difflib.unified_diff(
                current_text.splitlines(), text.splitlines(), str(args.output), "generated", lineterm=""
            )
            print("\n".join(diff))
            print(f"\n{args.output} is out of date: run tools/gen_chart_schema.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
