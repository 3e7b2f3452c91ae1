"""Config validation: defaults, overrides, and errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.config import ConfigError, load_config, parse_config, parse_duration, with_overrides
from kproxy.filters import build_filters


def test_defaults() -> None:
    cfg = parse_config({})
    assert (cfg.listen.host, cfg.listen.port) == ("127.0.0.1", 8001)
    assert (cfg.admin_listen.host, cfg.admin_listen.port) == ("127.0.0.1", 9099)
    assert cfg.credentials == "proxy"
    assert cfg.max_request_body_bytes == 3 * 1024 * 1024
    assert cfg.filters == []


def test_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "config.example.yaml")
    assert cfg.credentials == "proxy"
    assert build_filters(cfg) == []


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"listen": "nope"}, "listen: expected HOST:PORT, got 'nope'"),
        ({"listen": 5}, "listen: must be HOST:PORT, e.g. 127.0.0.1:8001"),
        ({"credentials": "steal"}, "credentials: must be one of 'proxy', 'forward' or 'impersonate', not 'steal'"),
        ({"credentials": "forwrd"}, "not 'forwrd' (did you mean 'forward'?)"),
        ({"credentails": "proxy"}, "credentails: unknown key (did you mean 'credentials'?)"),
        ({"upstream": {"kubeconfg": "x"}}, "upstream.kubeconfg: unknown key (did you mean 'kubeconfig'?)"),
        ({"upstream": 3}, "upstream: must be a mapping with the keys kubeconfig, context,"),
        ({"shutdown_timeout": "soon"}, "shutdown_timeout: expected a duration"),
        ({"max_request_body_bytes": 0}, "max_request_body_bytes: must be greater than 0"),
        ({"allow_remote": "maybe"}, "allow_remote: must be true or false"),
        ({"filters": [{"encodings": ["gzip"]}]}, "filters[0].name: is required"),
        ({"filters": [{"name": "no-such-filter"}]}, "filters[0].name: unknown filter 'no-such-filter'"),
        ({"filters": [{"name": "compresion"}]}, "unknown filter 'compresion' (did you mean 'compression'?)"),
        ({"filters": [{"name": "compression", "gzip_levl": 1}]}, "filters[0].gzip_levl: unknown key (did you mean"),
        ({"filters": [{"name": "watchcache", "resources": "pods"}]}, "filters[0].resources: must be a list"),
        ({"log": {"format": "xml"}}, "log.format: must be one of 'text' or 'json', not 'xml'"),
    ],
)
def test_errors_name_the_key(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_filters(parse_config(data))
    assert needle in str(err.value)
    # In the config's words: none of pydantic's own phrasing or class names.
    for pydantic_words in ("Input should", "Value error", "valid dictionary", "instance of", "Field required"):
        assert pydantic_words not in str(err.value)


def test_duplicate_filter_names_rejected() -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        parse_config({"filters": [{"name": "a"}, {"name": "a"}]})


def test_proxy_mode_refuses_non_loopback_without_allow_remote() -> None:
    with pytest.raises(ConfigError, match="listen: 0.0.0.0 is not a loopback address"):
        parse_config({"listen": "0.0.0.0:8001"})
    assert parse_config({"listen": "0.0.0.0:8001", "allow_remote": True}).listen.host == "0.0.0.0"
    assert parse_config({"listen": "0.0.0.0:8001", "credentials": "forward"}).listen.port == 8001
    assert parse_config({"listen": "[::1]:8001"}).listen.host == "::1"


def test_overrides_apply_and_revalidate() -> None:
    cfg = with_overrides(
        parse_config({}), **{"listen": "127.0.0.1:9000", "log.level": "debug", "upstream.context": None}
    )
    assert cfg.listen.port == 9000 and cfg.log.level == "debug" and cfg.upstream.context is None
    with pytest.raises(ConfigError, match="log.level"):
        with_overrides(cfg, **{"log.level": "loud"})


@pytest.mark.parametrize(("raw", "seconds"), [(5, 5), ("30s", 30), ("2m", 120), ("250ms", 0.25), ("1.5h", 5400)])
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw) == seconds


def test_yaml_errors_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_client_ca_only_with_impersonate() -> None:
    tls = {"cert_file": "c", "key_file": "k", "client_ca_file": "ca"}
    with pytest.raises(ConfigError, match="tls.client_ca_file: client certificates identify callers only"):
        parse_config({"credentials": "forward", "tls": tls})
    cfg = parse_config({"credentials": "impersonate", "tls": tls, "listen": "0.0.0.0:8443"})
    assert cfg.impersonate.token_cache_ttl == 10.0  # impersonate mode may listen anywhere: callers are authenticated
