"""The docs cannot drift from the code: filter options are generated from the config models,
every core config key is in config.example.yaml, and relative links in docs/ resolve."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, ConfigDict

from kproxy.config import Config
from kproxy.filters import BUILTIN, lookup

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_filter_docs", REPO / "tools" / "gen_filter_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_filter_docs", module)
    spec.loader.exec_module(module)
    return module


def test_filter_docs_are_generated_from_the_models() -> None:
    gen = _generator()
    assert (DOCS / "filters.md").read_text() == gen.generate(), "docs/filters.md is stale: run `make docs`"


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_option_of_every_builtin_filter_is_documented(name: str) -> None:
    text = (DOCS / "filters.md").read_text()
    section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
    for field_name, field in lookup(name).config_model.model_fields.items():
        assert f"| `{field.alias or field_name}` |" in section


def test_generator_renders_types_defaults_and_comments() -> None:
    """The generator itself, on a model shaped like a filter's (comment docs, Field docs,
    nested settings and lists of them, durations, literals, required keys)."""
    from pydantic import Field

    from kproxy.config import Duration

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        #: How deep.
        depth: int = Field(default=3, ge=1)

    class Settings(BaseModel):
        model_config = ConfigDict(extra="forbid")
        #: Resources to cache, as
        #: resource.group.
        resources: list[str]
        mode: str = Field(default="fast", description="Which way.")
        # Between resyncs.
        period: Duration = 30.0
        kind: Inner = Inner()
        encoding: str | None = None
        rules: list[Inner] = []

    rows = _generator().options_rows(Settings)
    assert rows == [
        "| `resources` | list[str] | **required** | Resources to cache, as resource.group. |",
        '| `mode` | str | `"fast"` | Which way. |',
        "| `period` | duration (>= 0) | `30.0` | Between resyncs. |",
        '| `kind` | object | `{"depth": 3}` |  |',
        "| `kind.depth` | int (>= 1) | `3` | How deep. |",
        "| `encoding` | str \\| null | `null` |  |",
        "| `rules` | list[object] | `[]` |  |",
        "| `rules[].depth` | int (>= 1) | `3` | How deep. |",
    ]


def test_every_core_config_key_is_in_config_example() -> None:
    example = (REPO / "config.example.yaml").read_text()
    missing = [key for key in Config.model_fields if not re.search(rf"^#?\s*{re.escape(key)}:", example, re.MULTILINE)]
    assert not missing, f"config.example.yaml does not document: {missing}"


def test_relative_links_in_docs_resolve() -> None:
    broken = []
    for md in [*DOCS.glob("*.md"), REPO / "deploy" / "helm" / "kproxy" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.relative_to(REPO)} -> {target}")
    assert not broken
