"""The apiserver's texts for strict-decoding outcomes, per verb.

* ``Warning`` headers (staging/src/k8s.io/apiserver/pkg/endpoints/filters/warning.go and
  apimachinery/pkg/util/net/http.go ``NewWarningHeader``): ``299 - "<text>"`` with ``"`` and
  ``\\`` backslash-escaped, one header value per warning, deduplicated; the total is bounded at
  4096 runes, after which every warning is cut to 256 runes and later ones are dropped.
* POST/PUT Strict (create.go/update.go via ``transformDecodeError``): 400 BadRequest,
  ``<Kind> in version "<v>" cannot be handled as a <Kind>: strict decoding error: e1, e2``,
  where go-yaml's duplicates form one error ``yaml: unmarshal errors:\\n  line N: ...``.
"""

from __future__ import annotations

from collections.abc import Iterable

from kproxy.core.status import StatusError, bad_request
from kproxy.filters.validation.validator import Outcome

WARNING_TOTAL_RUNES = 4096
WARNING_TRUNCATED_RUNES = 256


def warning_value(text: str) -> str:
    """One ``Warning`` header value."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def warning_values(texts: Iterable[str]) -> list[str]:
    """Header values for warnings in order, deduplicated and bounded as the apiserver does."""
    seen: set[str] = set()
    ordered = [t for t in texts if not (t in seen or seen.add(t))]  # type: ignore[func-returns-value]
    total = sum(len(t) for t in ordered)
    if total <= WARNING_TOTAL_RUNES:
        return [warning_value(t) for t in ordered]
    out: list[str] = []
    used = 0
    for t in ordered:
        cut = t[:WARNING_TRUNCATED_RUNES]
        if used + len(cut) > WARNING_TOTAL_RUNES:
            break
        used += len(cut)
        out.append(warning_value(cut))
    return out


def strict_errors_text(outcome: Outcome) -> str:
    """``strict decoding error: ...`` (runtime.NewStrictDecodingError)."""
    parts: list[str] = []
    if outcome.yaml_errors:
        lines = "\n  ".join(outcome.errors[: outcome.yaml_errors])
        parts.append(f"yaml: unmarshal errors:\n  {lines}")
    parts.extend(outcome.errors[outcome.yaml_errors :])
    return "strict decoding error: " + ", ".join(parts)


def create_update_error(kind: str, version: str, outcome: Outcome) -> StatusError:
    """The 400 a Strict POST or PUT gets."""
    return bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: {strict_errors_text(outcome)}')
