"""Pure logic of credentials: proxy's filter: Go's net.SplitHostPort, the Go regexp subset, the
filter's order of checks and its config keys (end to end against kubectl proxy itself:
tests/e2e/test_proxy_mode_guard.py)."""

from __future__ import annotations

import re

import pytest

from kproxy.config import ConfigError, ProxyConfig, parse_config
from kproxy.gocompat.net import AddrError, split_host_port
from kproxy.gocompat.regexp import compile_go_regexp, translate
from kproxy.server.proxyguard import ProxyGuard, extract_host


@pytest.mark.parametrize(
    ("hostport", "want"),
    [
        # Go's own table (net/ipsock_test.go splitJoinTests and splitFailureTests).
        ("localhost:http", ("localhost", "http")),
        ("localhost:80", ("localhost", "80")),
        ("[::1]:80", ("::1", "80")),
        ("[fe80::1%lo0]:80", ("fe80::1%lo0", "80")),
        (":80", ("", "80")),
        ("127.0.0.1:", ("127.0.0.1", "")),
        ("[]:80", ("", "80")),
        ("[::1]:", ("::1", "")),
        ("www.google.com", "missing port in address"),
        ("127.0.0.1", "missing port in address"),
        ("[::1]", "missing port in address"),
        ("::1", "too many colons in address"),
        ("[::1]:80:80", "too many colons in address"),
        ("[::1]x:80", "missing port in address"),
        ("[foo:bar]", "missing port in address"),
        ("[foo:bar]baz", "missing port in address"),
        ("[foo]bar:baz", "missing port in address"),
        ("[foo]:[bar]:baz", "too many colons in address"),
        ("foo[bar]:baz", "unexpected '[' in address"),
        ("[foo]bar]:baz", "missing port in address"),
        ("foo]bar:baz", "unexpected ']' in address"),
        ("[foo]:[bar]baz", "unexpected '[' in address"),
        ("[foo]:]bar", "unexpected ']' in address"),
        ("[::1", "missing ']' in address"),
    ],
)
def test_split_host_port_is_gos(hostport: str, want: tuple[str, str] | str) -> None:
    if isinstance(want, tuple):
        assert split_host_port(hostport) == want
    else:
        with pytest.raises(AddrError, match=re.escape(want)):
            split_host_port(hostport)


def test_extract_host_is_kubectls() -> None:
    assert extract_host("localhost:8001") == "localhost"
    assert extract_host("[::1]:8001") == "::1"  # no brackets: "^\[::1\]$" does not match
    assert extract_host("[::1]") == "[::1]"  # SplitHostPort fails: the whole value
    assert extract_host("") == ""


@pytest.mark.parametrize(
    ("pattern", "text", "go_matches"),
    [
        # $ is the end of the text (Go's OneLine); Python's $ also matches before a final newline.
        ("^/api$", "/api\n", False),
        ("^/api$", "/api", True),
        # . does not match a newline in either; a negated class does in both (Go's ClassNL).
        ("^/a.b", "/a\nb", False),
        ("^/a[^x]b", "/a\nb", True),
        # \s is [\t\n\f\r ] in Go: no \v.
        (r"a\sb", "a\vb", False),
        (r"a\sb", "a\tb", True),
        (r"a\Sb", "a\vb", True),
        # \d and \w are ASCII in Go.
        (r"^\d$", "\u0663", False),
        (r"^\w$", "\u00e9", False),
        (r"^\W$", "\u00e9", True),
        # {,3} is literal text in Go.
        ("^a{,3}$", "a{,3}", True),
        ("^a{,3}$", "aa", False),
        ("^a{2,3}$", "aaa", True),
        # Literal punctuation inside a class (Python would warn about -- or &&).
        ("^[+--]$", ",", True),  # the range + to -
        ("^[a-]$", "-", True),
        ("^[&&]$", "&", True),
        ("^[]a]$", "]", True),
        ("^[a-c-]$", "-", True),
        # MatchString searches anywhere.
        ("exec", "/api/v1/namespaces/x/pods/y/exec", True),
        # A byte that is not UTF-8 (one surrogate) is one rune for Go (RuneError).
        ("^/a.b$", "/a\udcffb", True),
        ("^/a[a-z]b$", "/a\udcffb", False),
    ],
)
def test_translated_patterns_match_as_go(pattern: str, text: str, go_matches: bool) -> None:
    assert (compile_go_regexp(pattern).search(text) is not None) is go_matches


@pytest.mark.parametrize(
    "pattern",
    [
        "(?i)localhost",  # flags
        "(?P<h>x)",  # named groups
        "(?=x)",  # lookahead: not RE2
        r"(a)\1",  # back-reference: not RE2
        r"\pL",  # Unicode classes
        r"[[:alpha:]]",  # POSIX classes
        r"\Qa.b\E",
        r"\x41",
        "a**",  # nested repetition: an error in Go
        "a*+",  # a possessive in Python 3.11, an error in Go
        "*a",
        "a{1001}",
        "a{3,2}",
        "^*",
        "(a",
        "a)",
        "[a",
        "[z-a]",
        "[a--]",  # Go: the range a to -, backwards
        r"[\D]",
        "caf\u00e9",
        "a\\",
    ],
)
def test_patterns_outside_the_subset_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        translate(pattern)


def test_kubectl_defaults_translate() -> None:
    cfg = ProxyConfig()
    for p in [*cfg.accept_hosts, *cfg.accept_paths, *cfg.reject_paths, *cfg.reject_methods]:
        compile_go_regexp(p)
    assert cfg.accept_hosts == [r"^localhost$", r"^127\.0\.0\.1$", r"^\[::1\]$"]
    assert cfg.reject_paths == [r"^/api/.*/pods/.*/exec", r"^/api/.*/pods/.*/attach"]


def test_order_of_checks_is_kubectls() -> None:
    guard = ProxyGuard(ProxyConfig(reject_methods=["^DELETE$"]))
    assert guard.why_not("GET", "/api/v1/namespaces", "localhost:8001") is None
    assert guard.why_not("GET", "/api/v1/namespaces/a/pods/b/exec", "localhost") == "path"
    assert guard.why_not("DELETE", "/api/v1/namespaces/a", "localhost") == "method"
    assert guard.why_not("GET", "/api/v1/namespaces", "evil.example.com") == "host"
    assert guard.why_not("GET", "/api/v1/namespaces/a/pods/b/exec", "evil") == "path"  # reject paths first
    # An empty accept list accepts nothing, as kubectl's --accept-hosts=''.
    assert ProxyGuard(ProxyConfig(accept_hosts=[])).why_not("GET", "/", "localhost") == "host"


@pytest.mark.parametrize(
    ("origins", "why"),
    [
        (None, None),
        (["http://localhost:3000"], None),
        (["https://[::1]"], None),
        (["https://[::1]:8443"], "origin"),  # as for Host: SplitHostPort leaves ::1, not [::1]
        (["http://127.0.0.1"], None),
        (["https://evil.example.com"], "origin"),
        (["null"], "origin"),
        (["http://localhost:3000", "https://evil.example.com"], "origin"),
        (["http://localhost/path"], "origin"),
        (["localhost"], "origin"),
        (["http://localhost@evil.example.com"], "origin"),
    ],
)
def test_origin_must_name_an_accepted_host(origins: list[str] | None, why: str | None) -> None:
    guard = ProxyGuard(ProxyConfig())
    assert guard.why_not("GET", "/api/v1/secrets", "localhost:8001", origins) == why
    assert ProxyGuard(ProxyConfig(check_origin=False)).why_not("GET", "/api/v1/secrets", "localhost", origins) is None


def test_config_keys() -> None:
    cfg = parse_config({"proxy": {"accept_hosts": r"^a$,^b\.c$", "reject_paths": ""}})
    assert cfg.proxy.accept_hosts == ["^a$", r"^b\.c$"]  # kubectl's flag form, split on commas
    assert cfg.proxy.reject_paths == []
    with pytest.raises(ConfigError, match=r"proxy\.accept_hosts\[1\]: .*only \(\.\.\.\) and \(\?:\.\.\.\) groups"):
        parse_config({"proxy": {"accept_hosts": ["^a$", "(?i)^a$"]}})
    with pytest.raises(ConfigError, match="proxy: applies only with credentials: proxy"):
        parse_config({"credentials": "forward", "proxy": {"reject_paths": []}})
    assert parse_config({"credentials": "forward", "proxy": {}}).credentials == "forward"
