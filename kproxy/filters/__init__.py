"""Filter registry: built-in filters by name, third-party ones from the ``kproxy.filters``
entry-point group.

A filter class has ``name`` (its config name), ``config_model`` (a pydantic model of its
settings, ``extra="forbid"`` so typos are caught) and is built as ``cls(settings)``.

The package holds one subpackage per built-in filter, each with its private modules.
Filters never import each other (an import-linter independence contract); this registry imports
only ``kproxy.core`` and ``kproxy.config``, and a filter only when a config names it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, cast

from pydantic import BaseModel, ValidationError

from kproxy.config import Config, ConfigError, FilterEntry, did_you_mean, format_validation_error
from kproxy.core.chain import Filter

ENTRY_POINT_GROUP = "kproxy.filters"


class FilterClass(Protocol):
    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]

    def __call__(self, settings: Any) -> Filter: ...


# Built-in filters register here as they are written (compression, transcode, watchcache,
# dryrun, validation): name -> "module:Class", imported only when a config names them.
BUILTIN: dict[str, str] = {
    "compression": "kproxy.filters.compression:Compression",
    "dryrun": "kproxy.filters.dryrun:DryRun",
    "transcode": "kproxy.filters.transcode:Transcode",
    "validation": "kproxy.filters.validation:Validation",
    "watchcache": "kproxy.filters.watchcache:WatchCacheFilter",
}


def _import(target: str) -> FilterClass:
    module, _, attr = target.partition(":")
    mod = __import__(module, fromlist=[attr])
    return cast(FilterClass, getattr(mod, attr))


def available() -> dict[str, str]:
    """Every filter name this installation knows, with where it comes from."""
    names = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def lookup(name: str) -> FilterClass:
    if name in BUILTIN:
        return _import(BUILTIN[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return cast(FilterClass, ep.load())
    names = sorted(available())
    known = ", ".join(names) or "none installed"
    raise ConfigError(f"unknown filter {name!r}{did_you_mean(name, names)} (known: {known})")


def build_filter(index: int, entry: FilterEntry) -> Filter:
    where = f"filters[{index}]"
    try:
        cls = lookup(entry.name)
    except ConfigError as err:
        raise ConfigError(f"{where}.name: {err}") from None
    model = getattr(cls, "config_model", None)
    if model is None:
        raise ConfigError(f"{where}.name: filter {entry.name!r} has no config_model")
    try:
        settings = model.model_validate(entry.settings)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where, model)) from None
    try:
        return cls(settings)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {err}") from None


def build_filters(cfg: Config) -> list[Filter]:
    """Instantiate the configured chain, in order; raise ConfigError naming the bad key."""
    return [build_filter(i, entry) for i, entry in enumerate(cfg.filters)]
