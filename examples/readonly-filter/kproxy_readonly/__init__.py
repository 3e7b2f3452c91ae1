"""An example third-party kproxy filter: writes are refused outside chosen namespaces.

Registered through the ``kproxy.filters`` entry-point group (see pyproject.toml), configured as::

    filters:
      - name: readonly
        allow_namespaces: [scratch, "dev-*"]
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from kproxy.filterapi import Exchange, FilterBase, Handler, Reply, forbidden


class ReadOnlySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Namespace globs where writes stay allowed; empty = read-only everywhere.
    allow_namespaces: list[str] = []


class ReadOnly(FilterBase):
    """Refuse mutating requests outside ``allow_namespaces`` with an apiserver-shaped 403."""

    name: ClassVar[str] = "readonly"
    config_model: ClassVar[type[BaseModel]] = ReadOnlySettings

    def __init__(self, settings: ReadOnlySettings) -> None:
        self.settings = settings

    def allowed(self, namespace: str) -> bool:
        return any(fnmatchcase(namespace, pat) for pat in self.settings.allow_namespaces) if namespace else False

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        info = ex.info
        if not info.is_mutating or self.allowed(info.namespace):
            return await call_next(ex)
        where = ", ".join(self.settings.allow_namespaces) or "no namespace"
        resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
        err = forbidden(
            info.api_group, resource, info.name, f"kproxy readonly filter: writes are allowed only in {where}"
        )
        return Reply.from_status(err, ex)  # in the media type the client negotiated
