"""Which resources the cache holds: names from the config resolved through the apiserver's discovery
(as the process's one reader, ``kproxy.core.discovery``, read it).

A config entry is ``RESOURCE`` (``pods``: the core group first, then the groups in discovery's
priority order, each at its preferred version), ``RESOURCE.GROUP`` (``deployments.apps``),
``GROUP/VERSION/RESOURCE`` (``apps/v1/deployments``), ``v1/RESOURCE`` (core), or ``*``: every
resource that supports both list and watch, at its group's preferred version.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from kproxy.cacher import Kind
from kproxy.core.discovery import ServedResource


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    group: str
    version: str
    resource: str
    namespaced: bool
    kind: Kind

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_path(self) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/{self.resource}"

    @property
    def label(self) -> str:
        """The name metrics and logs use: ``pods``, ``deployments.apps``."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.resource)


class ConfigError(ValueError):
    pass


def parse_name(name: str) -> tuple[str | None, str | None, str]:
    """A config entry -> (group or None for "any", version or None for "preferred", resource)."""
    parts = name.split("/")
    if name == "*":
        return None, None, "*"
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if len(parts) == 2:
        if parts[0] != "v1":
            raise ConfigError(f"{name!r}: use GROUP/VERSION/RESOURCE or v1/RESOURCE")
        return "", "v1", parts[1]
    if len(parts) == 1 and "." in name:
        resource, group = name.split(".", 1)
        return group, None, resource
    if len(parts) == 1 and name:
        return None, None, name
    raise ConfigError(f"{name!r} is not a resource name")


def checked_names(value: list[str]) -> list[str]:
    """A settings field's resource names, each one ``parse_name`` takes (pydantic's validator)."""
    for name in value:
        try:
            parse_name(name)
        except ConfigError as err:
            raise ValueError(str(err)) from None
    return value


#: A settings field holding resource names (``pods``, ``deployments.apps``, ``*``).
ResourceNames = Annotated[list[str], AfterValidator(checked_names)]


@dataclass(slots=True)
class _Served:
    group: str
    version: str
    preferred: bool
    entry: dict[str, Any]


def list_watch_resources(resources: Iterable[ServedResource]) -> list[_Served]:
    """The list+watch resources of discovery (``kproxy.core.discovery``, the process's one
    reader), every served group version, in discovery's priority order."""
    return [
        _Served(
            r.group,
            r.version,
            r.preferred,
            {
                "name": r.resource,
                "kind": r.kind,
                "namespaced": r.namespaced,
                "verbs": list(r.verbs),
                "singularName": r.singular,
                "shortNames": list(r.short_names),
            },
        )
        for r in resources
        if r.list_watch
    ]


def resolve(
    names: Iterable[str], served: list[_Served], knows_protobuf: Callable[[str, str], bool]
) -> tuple[list[ResourceSpec], list[str]]:
    """The specs for the configured names, and the names discovery does not have (yet: a custom
    resource whose definition is not installed)."""
    specs: dict[tuple[str, str, str], ResourceSpec] = {}
    missing: list[str] = []

    def spec(s: _Served) -> ResourceSpec:
        e = s.entry
        api_version = f"{s.group}/{s.version}" if s.group else s.version
        kind = e.get("kind", "")
        return ResourceSpec(
            s.group,
            s.version,
            e["name"],
            bool(e.get("namespaced")),
            Kind(api_version, kind, kind + "List", knows_protobuf(api_version, kind)),
        )

    for name in names:
        group, version, resource = parse_name(name)
        if resource == "*":
            for s in served:
                if s.preferred:
                    sp = spec(s)
                    specs.setdefault(sp.key, sp)
            continue
        found = [
            s
            for s in served
            if s.entry["name"] == resource
            and (group is None or s.group == group)
            and (s.version == version if version is not None else s.preferred)
        ]
        if not found:
            missing.append(name)
            continue
        sp = spec(found[0])
        specs.setdefault(sp.key, sp)
    return list(specs.values()), missing


Key = tuple[str, str, str]  # (group, version, resource)

#: Reads of discovery that must all lack a cached resource, the apiserver ready at each, before
#: its cache is dropped, and the most time between two of them (the refresh interval, if
#: shorter). A restarting apiserver serves a partial discovery (``apiregistration.k8s.io`` alone,
#: for ~0.1 s) about a second before /readyz turns ok, and with several apiservers behind one
#: address the readiness probe and the discovery read may reach different ones: three reads
#: spread over 10 s cannot all land in one instance's startup.
CONFIRMATIONS = 3
CONFIRMATION_SPACING = 5.0


class Departures:
    """Cached resources that discovery stopped listing, kept until their absence is confirmed.

    A resource is gone when ``CONFIRMATIONS`` consecutive discovery reads, each made while the
    apiserver said it was ready, lacked it and those reads span ``span`` seconds. A read made while
    the apiserver is not ready says nothing of what it serves (it is still assembling discovery)
    and starts the count again; so does a read that lists the resource. Meanwhile the cache keeps
    serving: reads and watches of a resource that really went are answered by its reflector's
    own failure (the cache turns unready and passes reads to the apiserver)."""

    def __init__(
        self, confirmations: int = CONFIRMATIONS, span: float = (CONFIRMATIONS - 1) * CONFIRMATION_SPACING
    ) -> None:
        self.confirmations = confirmations
        self.span = span
        self._misses: dict[Key, tuple[int, float]] = {}  # key -> (reads lacking it, time of the first)

    @property
    def pending(self) -> list[Key]:
        """The resources discovery lacks whose absence is not confirmed yet."""
        return list(self._misses)

    def observe(self, cached: Iterable[Key], listed: Iterable[Key], *, ready: bool, now: float) -> list[Key]:
        """One discovery read: ``listed`` are the resources it has. Returns the cached resources
        now confirmed gone (forgotten here: the caller drops them)."""
        listed = set(listed)
        absent = [k for k in cached if k not in listed]
        if not ready:
            self._misses.clear()
            return []
        misses: dict[Key, tuple[int, float]] = {}
        gone: list[Key] = []
        for key in absent:
            count, first = self._misses.get(key, (0, now))
            count += 1
            if count >= self.confirmations and now - first >= self.span:
                gone.append(key)
            else:
                misses[key] = (count, first)
        self._misses = misses
        return gone

    def forget(self, key: Key) -> None:
        """The resource's cache was dropped for another reason (its definition deleted)."""
        self._misses.pop(key, None)


def missing_note(name: str, served: list[_Served]) -> str:
    """A configured name discovery lacks, quoted, with the served resource it most likely meant
    (``"pod" (did you mean "pods"?)``): the one whose singular name, short name or kind it is
    (the names kubectl also accepts, but a cache entry must use the plural), else the closest
    plural name. Only discovery's names are suggested; a name near none is left alone."""
    try:
        group, _, resource = parse_name(name)
    except ConfigError:
        return repr(name)
    candidates = [s for s in served if group is None or s.group == group]

    def config_name(s: _Served) -> str:
        return f"{s.entry['name']}.{s.group}" if s.group else str(s.entry["name"])

    lowered = resource.lower()
    for s in candidates:
        e = s.entry
        if lowered in (str(e.get("singularName", "")).lower(), str(e.get("kind", "")).lower()) or lowered in (
            str(n).lower() for n in e.get("shortNames") or ()
        ):
            return f'"{name}" (did you mean "{config_name(s)}"?)'
    names = {str(s.entry["name"]): s for s in candidates}
    close = difflib.get_close_matches(lowered, list(names), n=1, cutoff=0.8)
    if close:
        return f'"{name}" (did you mean "{config_name(names[close[0]])}"?)'
    return f'"{name}"'
