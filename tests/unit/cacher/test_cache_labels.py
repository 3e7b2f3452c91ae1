"""kproxy.cacher.labels against the cases of apimachinery's own tests and the apiserver's messages.

Tables marked "selector_test.go" are ported from
``staging/src/k8s.io/apimachinery/pkg/labels/selector_test.go`` (TestSelectorParse, TestSelectorMatches,
TestLexer, TestLexerSequence, TestRequirementConstructor, TestRequirementSelectorMatching,
TestSetSelectorParser); the error messages were read from kube-apiserver v1.37.1 answers (the e2e test
``tests/e2e/test_selectors_apiserver.py`` compares every message of its table with the live apiserver).
"""

from __future__ import annotations

import pytest

from kproxy.cacher import labels as L
from kproxy.cacher.labels import LabelSelector, Requirement, SelectorError, parse_label_selector


def _reqs(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(r.key, r.operator, r.values) for r in parse_label_selector(text).requirements]


# selector_test.go TestSelectorParse (good and bad strings)
@pytest.mark.parametrize(
    "text", ["x=a,y=b,z=c", "", "x!=a,y=b", "x=", "x= ", "x=,z= ", "x= ,z= ", "!x", "x>1", "x>1,z<5"]
)
def test_go_good_strings_parse(text: str) -> None:
    parse_label_selector(text)


@pytest.mark.parametrize("text", ["x=a||y=b", "x==a==b", "!x=a", "x<a"])
def test_go_bad_strings_fail(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


# selector_test.go TestSetSelectorParser: (input, requirements sorted by key) or None when invalid
SET_PARSER = [
    ("", []),
    ("\rx", [("x", "exists", ())]),
    ("this-is-a-dns.domain.com/key-with-dash", [("this-is-a-dns.domain.com/key-with-dash", "exists", ())]),
    (
        "this-is-another-dns.domain.com/key-with-dash in (so,what)",
        [("this-is-another-dns.domain.com/key-with-dash", "in", ("so", "what"))],
    ),
    (
        "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
        [("0.1.2.domain/99", "notin", ("10.10.100.1", "tick.tack.clock"))],
    ),
    ("foo  in\t (abc)", [("foo", "in", ("abc",))]),
    ("x notin\n (abc)", [("x", "notin", ("abc",))]),
    ("x  notin\t\t\t(abc,def)", [("x", "notin", ("abc", "def"))]),
    ("x in (abc,def)", [("x", "in", ("abc", "def"))]),
    ("x in (abc,)", [("x", "in", ("", "abc"))]),
    ("x in ()", [("x", "in", ("",))]),
    (
        "x notin (abc,def),bar,z in (),w",
        # The Go table lists x's values as {"abc", "", "def"}; its parser (and the apiserver, see the e2e
        # test's "app notin (web,db)" over an object with app="") gives {"abc", "def"}.
        [("bar", "exists", ()), ("w", "exists", ()), ("x", "notin", ("abc", "def")), ("z", "in", ("",))],
    ),
    ("x=a", [("x", "=", ("a",))]),
    ("x>1", [("x", "gt", ("1",))]),
    ("x<7", [("x", "lt", ("7",))]),
    ("x=a,y!=b", [("x", "=", ("a",)), ("y", "!=", ("b",))]),
    ("x=a,y!=b,z in (h,i,j)", [("x", "=", ("a",)), ("y", "!=", ("b",)), ("z", "in", ("h", "i", "j"))]),
    ("x=a||y=b", None),
    ("x,y", [("x", "exists", ()), ("y", "exists", ())]),
    (",x,y", None),
    ("x nott in (y)", None),
    ("x notin ( )", [("x", "notin", ("",))]),
    ("x notin (, a)", [("x", "notin", ("", "a"))]),
    ("a in (xyz),", None),
    ("a in (xyz)b notin ()", None),
    ("a ", [("a", "exists", ())]),
    ("a in (x,y,notin, z,in)", [("a", "in", ("in", "notin", "x", "y", "z"))]),
    ("a in (xyz abc)", None),
    ("a notin(", None),
    ("a (", None),
    ("(", None),
]


@pytest.mark.parametrize(("text", "want"), SET_PARSER)
def test_go_set_selector_parser(text: str, want: list[tuple[str, str, tuple[str, ...]]] | None) -> None:
    if want is None:
        with pytest.raises(SelectorError):
            parse_label_selector(text)
    else:
        assert _reqs(text) == want


# selector_test.go TestSelectorMatches and TestRequirementSelectorMatching
MATCHES = [
    ("", {"x": "y"}, True),
    ("x=y", {"x": "y"}, True),
    ("x=y,z=w", {"x": "y", "z": "w"}, True),
    ("x!=y,z!=w", {"x": "z", "z": "a"}, True),
    ("notin=in", {"notin": "in"}, True),
    ("x", {"x": "z"}, True),
    ("!x", {"y": "z"}, True),
    ("x>1", {"x": "2"}, True),
    ("x<1", {"x": "0"}, True),
    ("x=z", {}, False),
    ("x=y", {"x": "z"}, False),
    ("x=y,z=w", {"x": "w", "z": "w"}, False),
    ("x!=y,z!=w", {"x": "z", "z": "w"}, False),
    ("x", {"y": "z"}, False),
    ("!x", {"x": "z"}, False),
    ("x>1", {"x": "0"}, False),
    ("x<1", {"x": "2"}, False),
    ("foo=bar", {"foo": "bar", "baz": "blah"}, True),
    ("foo=bar,baz=blah", {"foo": "bar", "baz": "blah"}, True),
    ("foo=blah", {"foo": "bar", "baz": "blah"}, False),
    ("foo=bar,foobar=bar,baz=blah", {"foo": "bar", "baz": "blah"}, False),
    ("x in (foo),y notin (alpha)", {"x": "foo", "y": "baz"}, True),
    ("x in (foo),y in (alpha)", {"x": "foo", "y": "baz"}, False),
    ("x notin (),y", {"y": ""}, True),
    ("!x,y", {"y": ""}, True),
    ("x notin (),!y", {"y": ""}, False),
    ("x in ()", {"y": "baz"}, False),
    ("z>1", {"z": "2"}, True),
    ("z>1", {"z": "v2"}, False),
    # kproxy additions: the semantics the cache relies on
    ("x!=a", {}, True),  # != matches objects without the key
    ("x notin (a)", {}, True),  # notin likewise
    ("x in (a)", {}, False),  # in needs the key
    ("x in ()", {"x": ""}, True),  # () is the set {""}
    ("x=", {"x": ""}, True),
    ("x=", {}, False),
    ("x!=", {}, True),
    ("x!=", {"x": ""}, False),
    ("x>1", {}, False),
    ("x<1", {}, False),
    ("x>5", {"x": "007"}, True),  # ParseInt reads leading zeros
    ("x>5", {"x": "1_0"}, False),  # ... but not underscores (Python's int() would)
    ("x>5", {"x": " 9"}, False),  # ... nor spaces
    ("x>5", {"x": "99999999999999999999"}, False),  # out of int64: never matches
    ("x<5", {"x": "99999999999999999999"}, False),
    ("x>9223372036854775806", {"x": "9223372036854775807"}, True),
    ("x<1", {"x": "-3"}, True),  # a label value cannot be -3, but the matcher reads signs as Go does
    ("x>1", {"x": "+3"}, True),
    ("x>1", {"x": "\u0663"}, False),  # non-ASCII digits are not digits to Go
    ("X=a", {"x": "a"}, False),  # keys are case-sensitive
]


@pytest.mark.parametrize(("text", "labels", "want"), MATCHES)
def test_matching(text: str, labels: dict[str, str], want: bool) -> None:
    assert parse_label_selector(text).matches(labels) is want


# selector_test.go TestRequirementConstructor (through the parser, which builds requirements the same way)
@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("x in (foo)", True),
        ("x notin (foo)", True),
        ("x", True),
        ("!x", True),
        ("1foo in (bar)", True),
        ("1234 in (bar)", True),
        ("y>1", True),
        ("z<6", True),
        ("foo>bar", False),
        ("barz<blah", False),
        ("a" * 254, False),
    ],
)
def test_go_requirement_constructor(text: str, ok: bool) -> None:
    if ok:
        parse_label_selector(text)
    else:
        with pytest.raises(SelectorError):
            parse_label_selector(text)


# selector_test.go TestLexer and TestLexerSequence
@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", [L._EOS]),
        (",", [L._COMMA, L._EOS]),
        ("notin", [L._NOT_IN, L._EOS]),
        ("in", [L._IN, L._EOS]),
        ("=", [L._EQ, L._EOS]),
        ("==", [L._DOUBLE_EQ, L._EOS]),
        (">", [L._GT, L._EOS]),
        ("<", [L._LT, L._EOS]),
        ("!", [L._NOT, L._EOS]),
        ("!=", [L._NOT_EQ, L._EOS]),
        ("(", [L._OPEN_PAR, L._EOS]),
        (")", [L._CLOSED_PAR, L._EOS]),
        ("~", [L._IDENT, L._EOS]),
        ("||", [L._IDENT, L._EOS]),
        ("key in ( value )", [L._IDENT, L._IN, L._OPEN_PAR, L._IDENT, L._CLOSED_PAR, L._EOS]),
        ("key notin ( value )", [L._IDENT, L._NOT_IN, L._OPEN_PAR, L._IDENT, L._CLOSED_PAR, L._EOS]),
        (
            "key in ( value1, value2 )",
            [L._IDENT, L._IN, L._OPEN_PAR, L._IDENT, L._COMMA, L._IDENT, L._CLOSED_PAR, L._EOS],
        ),
        ("!key", [L._NOT, L._IDENT, L._EOS]),
        ("()", [L._OPEN_PAR, L._CLOSED_PAR, L._EOS]),
        ("x in (),y", [L._IDENT, L._IN, L._OPEN_PAR, L._CLOSED_PAR, L._COMMA, L._IDENT, L._EOS]),
        (
            "== != (), = notin",
            [L._DOUBLE_EQ, L._NOT_EQ, L._OPEN_PAR, L._CLOSED_PAR, L._COMMA, L._EQ, L._NOT_IN, L._EOS],
        ),
        ("key>2", [L._IDENT, L._GT, L._IDENT, L._EOS]),
        ("key<1", [L._IDENT, L._LT, L._IDENT, L._EOS]),
        # kproxy additions: longest special run that is a token; NUL reads as the end
        ("a>=1", [L._IDENT, L._GT, L._EQ, L._IDENT, L._EOS]),
        ("!!a", [L._NOT, L._NOT, L._IDENT, L._EOS]),
        ("a\x00b", [L._IDENT, L._IDENT, L._EOS]),
        ("a,\x00b", [L._IDENT, L._COMMA, L._IDENT, L._EOS]),  # a NUL inside a token's scan is consumed
        ("a, \x00b", [L._IDENT, L._COMMA, L._EOS]),  # one where a token starts ends the input
    ],
)
def test_lexer(text: str, tokens: list[int]) -> None:
    assert [t for t, _ in L._lex(text)] == tokens


# Messages as kube-apiserver v1.37.1 answers them (400, Status.message).
VALUE_ERR = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
NAME_ERR = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
INT_ERR = "for 'Gt', 'Lt' operators, the value must be an integer"
MESSAGES = [
    ("a=-b", f'unable to parse requirement: values[0][a]: Invalid value: "-b": {VALUE_ERR}'),
    ("-a", f'unable to parse requirement: <nil>: Invalid value: "-a": name part {NAME_ERR}'),
    (
        "a/b/c",
        f'unable to parse requirement: <nil>: Invalid value: "a/b/c": a valid label key {NAME_ERR} with an optional '
        "DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
    ),
    (
        "a>x",
        f'unable to parse requirement: values[0]: Invalid value: "x": {INT_ERR}',
    ),
    ("a>-1", f'unable to parse requirement: values[0][a]: Invalid value: "-1": {VALUE_ERR}'),
    (
        "a>1,b<",
        f'unable to parse requirement: values[0]: Invalid value: "": {INT_ERR}',
    ),
    ("x=y z", "found 'z', expected: ',' or 'end of string'"),
    ("!a=b", "found '=', expected: ',' or 'end of string'"),
    ("a,", "found '', expected: identifier after ','"),
    (",a", "found ',', expected: !, identifier, or 'end of string'"),
    ("a===b", "unable to parse requirement: found '=', expected: identifier"),
    ("a=b\x00c", "found 'c', expected: ',' or 'end of string'"),
    ("a!", "unable to parse requirement: found '!', expected: in, notin, =, ==, !=, gt, lt"),
    ("a=(b)", "unable to parse requirement: found '(', expected: identifier"),
    ("a in b", "unable to parse requirement: found 'b' expected: '('"),
]


@pytest.mark.parametrize(("text", "message"), MESSAGES)
def test_error_messages(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector(text)
    assert str(info.value) == message
    assert info.value.code == 400


def test_several_value_errors_are_aggregated() -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector("a>-x")
    assert str(info.value).startswith("unable to parse requirement: [values[0]: Invalid value: \"-x\": for 'Gt'")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("k" * 63, True),
        ("k" * 64, False),
        ("k=" + "v" * 63, True),
        ("k=" + "v" * 64, False),
        ("p" * 253 + "/k", True),
        ("p" * 254 + "/k", False),
        ("Example.com/k", False),  # the prefix is a lowercase DNS subdomain
        ("example.com/K", True),  # the name part may have capitals
        ("/k", False),
        ("p/", False),
        ("k=v\n", True),  # \n is whitespace to the lexer, never part of a value
        ("k=w\u00e9", False),
        ("\u00e9", False),
        ("\x00", True),  # nothing before the NUL: the empty selector
    ],
)
def test_validation_edges(text: str, ok: bool) -> None:
    if ok:
        parse_label_selector(text)
    else:
        with pytest.raises(SelectorError):
            parse_label_selector(text)


def test_empty_selector_matches_everything() -> None:
    for text in ("", " ", "\t\n"):
        sel = parse_label_selector(text)
        assert sel.empty and sel.matches({}) and sel.matches({"a": "b"})
    assert not parse_label_selector("a").empty


def test_requirement_api() -> None:
    sel = LabelSelector((Requirement("a", "in", ("x", "y")), Requirement("b", "!", ())))
    assert sel.matches({"a": "y"}) and not sel.matches({"a": "y", "b": ""}) and not sel.matches({"a": "z"})
    assert Requirement("n", "lt", ("10",)).matches({"n": "9"})
    assert L.validate_label_value("abc") and not L.validate_label_value("-abc")
