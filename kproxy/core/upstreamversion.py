"""The upstream apiserver's version (its ``/version``), for the few answers that differ by minor.

kproxy answers some requests itself exactly as the apiserver would (the watch cache's lists and
watches, the validation filter's policy), and a few of those answers changed between the minors
kproxy supports (docs/compatibility.md). One :class:`UpstreamVersion` per process, shared through
``FilterContext.services`` under :data:`UPSTREAM_VERSION`, holds what ``/version`` said last; it is
read when a filter that needs it starts and again on the watch cache's discovery cycle, so an
apiserver upgraded in place is noticed. Until it has been read (or when it cannot be), kproxy answers
as the newest minor it supports.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from kproxy.core.context import ApiClient, ServiceKey

log = logging.getLogger("kproxy.upstream")

#: ``FilterContext.services`` key of the process's one :class:`UpstreamVersion`.
UPSTREAM_VERSION: ServiceKey[UpstreamVersion] = ServiceKey(f"{__name__}.UpstreamVersion")

#: The Kubernetes minors kproxy supports and tests (docs/compatibility.md), oldest and newest.
SUPPORTED_MINORS = (35, 37)

# version.Info's major and minor are strings; some distributions add a "+" ("37+").
_NUMBER = re.compile(r"(\d{1,4})\+?")


def parse_version(doc: Any) -> tuple[int, int] | None:
    """``(major, minor)`` of a ``/version`` answer (``k8s.io/apimachinery/pkg/version.Info``), or
    None when it does not say (a missing or malformed field)."""
    if not isinstance(doc, dict):
        return None
    major = _NUMBER.fullmatch(str(doc.get("major", "")))
    minor = _NUMBER.fullmatch(str(doc.get("minor", "")))
    if major is None or minor is None:
        return None
    return int(major.group(1)), int(minor.group(1))


@dataclass(slots=True)
class UpstreamVersion:
    """The upstream's ``major.minor`` as last read; ``None`` until known."""

    version: tuple[int, int] | None = None
    git_version: str = ""

    def at_least(self, minor: int) -> bool:
        """Whether the upstream is Kubernetes 1.``minor`` or newer; True while unknown (kproxy then
        answers as the newest minor it supports)."""
        return self.version is None or self.version >= (1, minor)

    @property
    def minor(self) -> int | None:
        """The upstream's 1.x minor, None while unknown."""
        return self.version[1] if self.version is not None and self.version[0] == 1 else None

    async def read(self, api: ApiClient) -> None:
        """Ask ``/version``; keep the last answer when this one fails (logged once per change)."""
        try:
            status, doc = await api.json("GET", "/version", timeout=10.0)
        except Exception as err:  # the upstream unreachable: keep what was known
            log.debug("could not read the upstream's /version: %s", err)
            return
        parsed = parse_version(doc) if status == 200 else None
        if parsed is None:
            log.debug("the upstream's /version answered %s without a version", status)
            return
        if parsed == self.version:
            return
        before, self.version = self.version, parsed
        self.git_version = str(doc.get("gitVersion", "")) or f"{parsed[0]}.{parsed[1]}"
        was = "" if before is None else f" (was {before[0]}.{before[1]})"
        low, high = SUPPORTED_MINORS
        if parsed[0] == 1 and low <= parsed[1] <= high:
            log.info("the upstream is Kubernetes %s%s", self.git_version, was)
        else:
            log.warning(
                "the upstream is Kubernetes %s%s: kproxy supports 1.%d to 1.%d, and answers it makes itself "
                "may differ from this apiserver's (docs/compatibility.md)",
                self.git_version,
                was,
                low,
                high,
            )
