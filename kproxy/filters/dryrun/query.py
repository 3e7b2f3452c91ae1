"""``dryRun`` in the query, as the apiserver reads it (Go's ``url.ParseQuery``, a case-sensitive
lookup, ``ValidateDryRun``), and the query kproxy sends under ``enforce``."""

from __future__ import annotations

from kproxy.core.status import CauseType, StatusCause, StatusError, go_json_dumps, invalid
from kproxy.gocompat.url import query_values, with_param

__all__ = ["DRY_RUN_ALL", "enforce_query", "invalid_dry_run", "is_dry_run", "query_dry_run"]

DRY_RUN_ALL = "All"


def query_dry_run(raw_query: str) -> list[str]:
    """The ``dryRun`` values the apiserver reads from this query (exact key, every occurrence)."""
    return query_values(raw_query).get("dryRun", [])


def enforce_query(raw_query: str) -> str:
    """The query with every ``dryRun`` pair (any letter case, any encoding) replaced by one
    ``dryRun=All`` (``kproxy.gocompat.url.with_param``); every other pair is kept byte for byte.
    Raises TooManyQueryParams where Go would then read no parameter at all."""
    return with_param(raw_query, "dryRun", DRY_RUN_ALL, fold_case=True)


def is_dry_run(values: list[str] | None) -> bool:
    """``dryrun.IsDryRun`` after ``ValidateDryRun`` passed: at least one value, all ``All``."""
    return bool(values) and all(v == DRY_RUN_ALL for v in values or ())


def invalid_dry_run(kind: str, values: list[str]) -> StatusError:
    """The apiserver's 422 for dryRun values other than ``All`` (``ValidateDryRun`` via ``NewInvalid``)."""
    rendered = go_json_dumps(values).decode().rstrip("\n")
    message = f'Unsupported value: {rendered}: supported values: "{DRY_RUN_ALL}"'
    return invalid(kind, "meta.k8s.io", "", [StatusCause(CauseType.FIELD_VALUE_NOT_SUPPORTED, message, "dryRun")])
