"""The validation filter's settings and request plumbing (pure logic; behaviour is e2e)."""

from __future__ import annotations

import pytest
from multidict import MultiDict

from kproxy.config import ConfigError, parse_config
from kproxy.core.chain import Exchange
from kproxy.filters import build_filters
from kproxy.filters.validation import Validation, _options_valid, _set_field_validation
from kproxy.filters.validation.levels import Level
from kproxy.testing.exchange import make_exchange


def build(settings: dict[str, object]) -> Validation:
    (flt,) = build_filters(parse_config({"filters": [{"name": "validation", **settings}]}))
    assert isinstance(flt, Validation)
    return flt


def test_settings_are_validated_and_name_the_key() -> None:
    flt = build({"rules": [{"name": "prod", "match": {"namespaces": ["prod-*"]}, "level": "Strict"}]})
    assert flt.rules[0].minimum is Level.STRICT and flt.upstream_validates
    assert not build({"upstream_validates": "no"}).upstream_validates
    with pytest.raises(ConfigError, match=r"filters\[0\]\.rules\[0\]\.level"):
        build({"rules": [{"match": {}, "level": "strict"}]})
    with pytest.raises(ConfigError, match=r"filters\[0\]\.rules\[0\]\.match\.resources"):
        build({"rules": [{"match": {"resources": ["apps/deployments"]}, "level": "Warn"}]})
    with pytest.raises(ConfigError, match=r"filters\[0\]\.typo"):
        build({"typo": 1})


def exchange(query: str) -> Exchange:
    return make_exchange("POST", f"/api/v1/namespaces/a/configmaps?{query}", body=b"{}")


def test_the_level_is_replaced_and_other_parameters_kept() -> None:
    ex = exchange("dryRun=All&fieldValidation=Ignore&fieldManager=me&fieldValidation=Warn")
    _set_field_validation(ex, Level.STRICT)
    assert ex.query.getall("fieldValidation") == ["Strict"]
    assert ex.query.getall("dryRun") == ["All"] and ex.query.get("fieldManager") == "me"


def test_options_the_apiserver_would_reject_first() -> None:
    assert _options_valid(MultiDict([("dryRun", "All"), ("fieldManager", "kubectl")]))
    assert not _options_valid(MultiDict([("dryRun", "All"), ("dryRun", "all")]))
    assert not _options_valid(MultiDict([("dryRun", "")]))
    assert not _options_valid(MultiDict([("fieldManager", "m" * 129)]))
    assert not _options_valid(MultiDict([("fieldManager", "a\x01b")]))
