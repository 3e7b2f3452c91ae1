"""kproxy's metric naming scheme, and the names it replaced (still exported for one release).

Every metric is ``kproxy_<area>_<what>[_<unit>]``: ``<area>`` is a filter's config name
(``compression``, ``transcode``, ``watchcache``, ``dryrun``, ``validation``) or the server's part
(``requests``, ``connections``, ``http2``, ``token_reviews``, ``config``, ``gc``, ``upstream``);
units are ``_seconds`` and ``_bytes``; bytes a filter reads and writes are ``_input_bytes`` and
``_output_bytes``; a counter's name ends in ``_total`` and is spelled so where it is defined.
docs/monitoring.md lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

__all__ = ["RENAMED", "counter"]

#: Old name -> new name. The old names stay exported, counting the same, for one release
#: (dashboards and alerts may query them); CHANGELOG.md and docs/monitoring.md say so.
RENAMED: dict[str, str] = {
    "kproxy_transcode_in_bytes_total": "kproxy_transcode_input_bytes_total",
    "kproxy_transcode_out_bytes_total": "kproxy_transcode_output_bytes_total",
    "kproxy_transcoded_responses_total": "kproxy_transcode_responses_total",
    "kproxy_token_review_cache_hits_total": "kproxy_token_reviews_cache_hits_total",
}
_OLD_NAME = {new: old for old, new in RENAMED.items()}


class _Both:
    """A counter that counts under its old name too."""

    __slots__ = ("_new", "_old")

    def __init__(self, new: Any, old: Any) -> None:
        self._new = new
        self._old = old

    def labels(self, *values: str) -> _Both:
        return _Both(self._new.labels(*values), self._old.labels(*values))

    def inc(self, amount: float = 1) -> None:
        self._new.inc(amount)
        self._old.inc(amount)


def counter(name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry) -> Any:
    """A Counter named ``name``; one that was renamed counts under its old name as well."""
    new = Counter(name, documentation, labelnames, registry=registry)
    old_name = _OLD_NAME.get(name)
    if old_name is None:
        return new
    old = Counter(
        old_name,
        f"Deprecated: renamed {name}, removed in the next release. {documentation}",
        labelnames,
        registry=registry,
    )
    return _Both(new, old)
