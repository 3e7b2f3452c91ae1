"""The watchcache filter's persist settings: a sensitive resource only with a key, names checked."""

from __future__ import annotations

import pytest

from kproxy.config import ConfigError, parse_config
from kproxy.filters import build_filters


def _build(persist: dict[str, object]) -> None:
    build_filters(parse_config({"filters": [{"name": "watchcache", "resources": ["*"], "persist": persist}]}))


@pytest.mark.parametrize(
    ("persist", "needle"),
    [
        ({"dir": "/x", "resources": ["secrets"]}, "sensitive resource: it is persisted only encrypted"),
        ({"dir": "/x", "resources": ["*", "v1/secrets"]}, "set encryption_key_file"),
        ({"dir": "/x", "resources": ["widgets.example.com"], "sensitive": ["widgets"]}, "set encryption_key_file"),
        ({"dir": "/x", "resources": ["a/b"]}, "use GROUP/VERSION/RESOURCE or v1/RESOURCE"),
        ({"resources": ["*"]}, "persist.dir: is required"),
        ({"dir": "/x", "compact_min_bytes": 10}, "compact_min_bytes"),
    ],
)
def test_refused(persist: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        _build(persist)
    assert needle in str(err.value)


def test_accepted() -> None:
    _build({"dir": "/x"})  # "*" never includes secrets: no key needed
    _build({"dir": "/x", "resources": ["*", "secrets"], "encryption_key_file": "/k"})
