"""listing.select (pages of a snapshot, as the apiserver's cacher makes them) and continue tokens.

The start keys and token format follow ``storage/continue.go`` and ``cacher.GetList``: the
token's ``start`` is the last returned key relative to the list's prefix (no trailing slash),
plus ``\\0``; ``remainingItemCount`` is the count after the page, only without selectors.
"""

from __future__ import annotations

import base64
import random

import orjson
import pytest

from kproxy.cacher import CachedObject, ContinueToken, Kind, Page, Snapshot, WatchCache, decode_continue, select
from kproxy.cacher.continue_token import encode_continue, encode_inconsistent
from kproxy.cacher.listing import Predicate

POD = Kind("v1", "Pod", "PodList", protobuf=True)


def obj(key: str, rv: int = 1, **labels: str) -> CachedObject:
    namespace, _, name = key.rpartition("/")
    return CachedObject(key, namespace, name, rv, labels, {"metadata.name": name}, json=b"{}")


def snapshot(keys: list[str], rv: int = 100, labels: dict[str, dict[str, str]] | None = None) -> Snapshot:
    cache = WatchCache(POD)
    cache.replace([obj(k, 1, **(labels or {}).get(k, {})) for k in keys], rv)
    snap = cache.snapshot()
    assert snap is not None
    return snap


def keys_of(page: Page) -> list[str]:
    return [o.key for o in page.items]


def token_json(token: str) -> dict[str, object]:
    data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert isinstance(data, dict)
    return data


def page_all(snap: Snapshot, *, namespace: str = "", limit: int, predicate: Predicate | None = None) -> list[Page]:
    pages = [select(snap, namespace=namespace, limit=limit, predicate=predicate)]
    while pages[-1].continue_token:
        cont = decode_continue(pages[-1].continue_token)
        assert cont is not None and cont.rv == snap.rv
        pages.append(select(snap, namespace=namespace, limit=limit, predicate=predicate, start=cont.start))
        assert len(pages) < 100
    return pages


NS_KEYS = ["a-b/p1", "a/p1", "a/p2", "a/p3", "a/p4", "a/p5", "ab/p1", "b/p1", "b/p2"]


# -- select ---------------------------------------------------------------------------------------
def test_without_a_limit_everything_in_the_namespace_comes_at_once() -> None:
    snap = snapshot(NS_KEYS)
    page = select(snap, namespace="a")
    assert keys_of(page) == ["a/p1", "a/p2", "a/p3", "a/p4", "a/p5"]
    assert page.rv == 100 and page.continue_token == "" and page.remaining is None
    assert keys_of(select(snap)) == NS_KEYS
    assert keys_of(select(snap, namespace="ab")) == ["ab/p1"]
    assert keys_of(select(snap, namespace="zz")) == []
    assert keys_of(select(snap, limit=0, namespace="b")) == ["b/p1", "b/p2"]


def test_a_namespaced_page_has_a_start_key_relative_to_the_namespace() -> None:
    snap = snapshot(NS_KEYS)
    page = select(snap, namespace="a", limit=2)
    assert keys_of(page) == ["a/p1", "a/p2"]
    assert page.remaining == 3
    assert token_json(page.continue_token) == {"v": "meta.k8s.io/v1", "rv": 100, "start": "/p2\x00", "kp": 1}
    nxt = select(snap, namespace="a", limit=2, start="/p2\x00")
    assert keys_of(nxt) == ["a/p3", "a/p4"] and nxt.remaining == 1
    last = select(snap, namespace="a", limit=2, start="/p4\x00")
    assert keys_of(last) == ["a/p5"]
    assert last.continue_token == "" and last.remaining is None


def test_a_cluster_wide_page_has_a_start_key_with_the_namespace() -> None:
    snap = snapshot(NS_KEYS)
    page = select(snap, limit=3)
    assert keys_of(page) == ["a-b/p1", "a/p1", "a/p2"]
    assert page.remaining == 6
    assert token_json(page.continue_token)["start"] == "/a/p2\x00"
    nxt = select(snap, limit=3, start="/a/p2\x00")
    assert keys_of(nxt) == ["a/p3", "a/p4", "a/p5"]
    assert token_json(nxt.continue_token)["start"] == "/a/p5\x00"


def test_cluster_scoped_start_keys_are_the_name() -> None:
    snap = snapshot(["default", "kube-public", "kube-system"])
    page = select(snap, limit=1)
    assert keys_of(page) == ["default"]
    assert token_json(page.continue_token)["start"] == "/default\x00"
    assert keys_of(select(snap, limit=1, start="/default\x00")) == ["kube-public"]


def test_a_page_ending_exactly_at_the_end_has_no_token() -> None:
    snap = snapshot(NS_KEYS)
    page = select(snap, namespace="a", limit=5)
    assert len(page.items) == 5 and page.continue_token == "" and page.remaining is None
    page = select(snap, namespace="a", limit=500)
    assert len(page.items) == 5 and page.continue_token == ""
    empty = select(snap, namespace="nothing-here", limit=5)
    assert empty.items == [] and empty.continue_token == ""


def test_a_start_key_between_or_past_objects() -> None:
    snap = snapshot(NS_KEYS)
    # An object deleted since the token was issued: the scan goes on from its place.
    assert keys_of(select(snap, namespace="a", limit=2, start="/p25\x00")) == ["a/p3", "a/p4"]
    assert select(snap, namespace="a", limit=2, start="/p9\x00").items == []
    # Without the leading slash the apiserver reads the same key.
    assert keys_of(select(snap, namespace="a", limit=1, start="p3\x00")) == ["a/p4"]


def test_a_start_key_never_leaves_the_namespace() -> None:
    snap = snapshot(NS_KEYS)
    # A token from the cluster-wide list of another namespace used on a namespaced list.
    assert keys_of(select(snap, namespace="b", limit=10, start="/a/p2\x00")) == ["b/p1", "b/p2"]
    assert select(snap, namespace="a", limit=10, start="/zzz\x00").items == []
    assert keys_of(select(snap, namespace="a", limit=10, start="/\x00")) == ["a/p1", "a/p2", "a/p3", "a/p4", "a/p5"]


def test_with_a_predicate_a_page_fills_with_matches_and_has_no_remaining_count() -> None:
    labels = {k: {"even": "yes"} for k in ("a/p2", "a/p4", "b/p2")}
    snap = snapshot(NS_KEYS, labels=labels)

    def even(o: CachedObject) -> bool:
        return o.labels.get("even") == "yes"

    page = select(snap, limit=2, predicate=even)
    assert keys_of(page) == ["a/p2", "a/p4"]
    assert page.remaining is None
    assert token_json(page.continue_token)["start"] == "/a/p4\x00"
    nxt = select(snap, limit=2, start="/a/p4\x00", predicate=even)
    assert keys_of(nxt) == ["b/p2"] and nxt.continue_token == ""
    assert keys_of(select(snap, predicate=even)) == ["a/p2", "a/p4", "b/p2"]


def test_a_full_page_gets_a_token_even_when_nothing_more_matches() -> None:
    """The cacher learns a continuation is needed by reaching an item past a full page, whether
    or not that item (or any later one) matches; the next page is then empty."""
    snap = snapshot(NS_KEYS, labels={"a/p1": {"x": "1"}})
    page = select(snap, namespace="a", limit=1, predicate=lambda o: o.labels.get("x") == "1")
    assert keys_of(page) == ["a/p1"]
    assert page.continue_token != "" and page.remaining is None
    cont = decode_continue(page.continue_token)
    assert cont == ContinueToken(100, "/p1\x00")
    rest = select(snap, namespace="a", limit=1, start=cont.start, predicate=lambda o: o.labels.get("x") == "1")
    assert rest.items == [] and rest.continue_token == ""
    # The match is the namespace's last object: no item past the page, no token.
    snap = snapshot(NS_KEYS, labels={"a/p5": {"x": "1"}})
    page = select(snap, namespace="a", limit=1, predicate=lambda o: o.labels.get("x") == "1")
    assert keys_of(page) == ["a/p5"] and page.continue_token == ""


def test_no_match_at_all_is_an_empty_page_without_a_token() -> None:
    snap = snapshot(NS_KEYS)
    page = select(snap, limit=3, predicate=lambda o: False)
    assert page.items == [] and page.continue_token == "" and page.remaining is None


@pytest.mark.parametrize("namespace", ["", "a", "b", "ab", "none"])
@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7, 50])
@pytest.mark.parametrize("selective", [False, True])
def test_paging_to_the_end_equals_the_unpaged_list(namespace: str, limit: int, selective: bool) -> None:
    labels = {k: {"pick": "1"} for k in NS_KEYS[::2]}
    snap = snapshot(NS_KEYS, labels=labels)
    predicate: Predicate | None = (lambda o: o.labels.get("pick") == "1") if selective else None
    whole = keys_of(select(snap, namespace=namespace, predicate=predicate))
    pages = page_all(snap, namespace=namespace, limit=limit, predicate=predicate)
    assert [k for p in pages for k in keys_of(p)] == whole
    assert all(len(p.items) <= limit for p in pages)
    assert all(p.rv == snap.rv for p in pages)
    for i, p in enumerate(pages):
        if selective or not p.continue_token:
            assert p.remaining is None
        else:
            # The apiserver's count: every item after this page (no selector to make it inexact).
            assert p.remaining == len(whole) - sum(len(q.items) for q in pages[: i + 1])


def test_paging_an_old_snapshot_is_stable_while_the_cache_moves_on() -> None:
    cache = WatchCache(POD)
    cache.replace([obj(f"ns/p{i}", 1) for i in range(6)], 10)
    first = select(cache.snapshot() or snapshot([]), namespace="ns", limit=2)
    cont = decode_continue(first.continue_token)
    assert cont is not None and cont.rv == 10
    cache.apply("DELETED", obj("ns/p3", 11))
    cache.apply("ADDED", obj("ns/p21", 12))
    then = cache.snapshot(cont.rv)
    assert then is not None
    rest = page_all_from(then, cont.start, namespace="ns", limit=2)
    assert [o.key for o in first.items] + rest == [f"ns/p{i}" for i in range(6)]


def page_all_from(snap: Snapshot, start: str, *, namespace: str, limit: int) -> list[str]:
    out: list[str] = []
    while True:
        page = select(snap, namespace=namespace, limit=limit, start=start)
        out += keys_of(page)
        if not page.continue_token:
            return out
        cont = decode_continue(page.continue_token)
        assert cont is not None
        start = cont.start


def model_page(
    keys: list[str], matches: set[str], *, namespace: str, limit: int, start: str, selective: bool
) -> tuple[list[str], str, int | None]:
    """The cacher's GetList loop written out plainly: scan the range from the start key, stop at
    the first item past a full page; the token's start is the last returned key after the
    list's prefix; the remaining count is what the range holds after the page."""
    prefix = namespace + "/" if namespace else ""
    in_range = [k for k in sorted(keys) if k.startswith(prefix)]
    begin = prefix + start.removeprefix("/")
    scan = [k for k in in_range if k >= begin]
    out: list[str] = []
    more = False
    for k in scan:
        if limit and len(out) >= limit:
            more = True
            break
        if not selective or k in matches:
            out.append(k)
    if not more:
        return out, "", None
    last = "/" + out[-1][len(prefix) :] + "\x00"
    return out, last, None if selective else len(scan) - limit


def test_random_pages_agree_with_a_plain_model_of_the_cacher() -> None:
    rng = random.Random(7)
    for _ in range(300):
        namespaces = rng.sample(["a", "a-b", "ab", "b", "kube-system", "z"], rng.randint(1, 4))
        keys = sorted({f"{rng.choice(namespaces)}/p{rng.randint(0, 30)}" for _ in range(rng.randint(0, 25))})
        matches = {k for k in keys if rng.random() < 0.4}
        snap = snapshot(keys)
        selective = rng.random() < 0.5
        namespace = rng.choice([*namespaces, ""])
        limit = rng.randint(0, 6)
        start = ""
        if keys and rng.random() < 0.5:
            k = rng.choice(keys)
            if not namespace or k.startswith(namespace + "/"):
                start = "/" + (k[len(namespace) + 1 :] if namespace else k) + "\x00"
        predicate: Predicate | None = (lambda o, m=matches: o.key in m) if selective else None
        page = select(snap, namespace=namespace, limit=limit, start=start, predicate=predicate)
        want_keys, want_start, want_remaining = model_page(
            keys, matches, namespace=namespace, limit=limit, start=start, selective=selective
        )
        assert keys_of(page) == want_keys
        assert page.remaining == want_remaining
        if want_start:
            assert decode_continue(page.continue_token) == ContinueToken(snap.rv, want_start)
        else:
            assert page.continue_token == ""


# -- continue tokens ------------------------------------------------------------------------------
def test_a_token_round_trips() -> None:
    for rv, key in [(1, "/p"), (123456789012, "/ns/name.with.dots"), (7, "/a-b/c")]:
        token = encode_continue(rv, key)
        assert decode_continue(token) == ContinueToken(rv, key + "\x00")


def test_a_token_is_base64url_without_padding_and_the_apiservers_json() -> None:
    for n in range(1, 12):  # names of every length mod 3, so padding would show up
        token = encode_continue(99, "/" + "x" * n)
        assert "=" not in token and "+" not in token and "/" not in token
        data = token_json(token)
        assert data == {"v": "meta.k8s.io/v1", "rv": 99, "start": "/" + "x" * n + "\x00", "kp": 1}
    # A key whose JSON encodes to bytes that need the URL alphabet's "-" and "_".
    tricky = encode_continue(1, "/??>>??~~~")
    assert "-" in tricky or "_" in tricky
    assert decode_continue(tricky) == ContinueToken(1, "/??>>??~~~\x00")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_the_apiservers_own_tokens_at_a_revision_are_not_kproxys() -> None:
    apiserver = _b64(b'{"v":"meta.k8s.io/v1","rv":42,"start":"/p2\\u0000"}')
    assert decode_continue(apiserver) is None


def test_tokens_at_the_latest_revision_are_served_whoever_issued_them() -> None:
    """The apiserver's inconsistent continue (``rv`` -1, its start without the leading "/")
    names no snapshot, only a key: the cacher serves any negative ``rv`` as a consistent read."""
    for raw, start in [
        (b'{"v":"meta.k8s.io/v1","rv":-1,"start":"template-0003\\u0000"}', "template-0003\x00"),
        (b'{"v":"meta.k8s.io/v1","rv":-1,"start":"/p2\\u0000"}', "/p2\x00"),
        (b'{"v":"meta.k8s.io/v1","rv":-7,"start":"ns/p\\u0000","kp":1}', "ns/p\x00"),
    ]:
        cont = decode_continue(_b64(raw))
        assert cont is not None and cont.latest and cont.start == start


def test_the_inconsistent_token_is_the_apiservers_byte_for_byte() -> None:
    # Recorded from kube-apiserver v1.37.1: the 410 for a compacted token that started at
    # "/template-0003\0" (namespaced list) carries this token.
    want = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoidGVtcGxhdGUtMDAwM1x1MDAwMCJ9"
    assert encode_inconsistent("/template-0003\x00") == want
    # Go's HTML escaping inside strings.
    assert token_json(encode_inconsistent("/a<b>&\x00")) == {"v": "meta.k8s.io/v1", "rv": -1, "start": "a<b>&\x00"}
    raw = base64.urlsafe_b64decode(encode_inconsistent("/a<b>&\x00") + "==")
    assert b"\\u003c" in raw and b"\\u003e" in raw and b"\\u0026" in raw


@pytest.mark.parametrize(
    "members",
    [
        b'"RV":-1',  # Go matches member names case-insensitively: the last one would win there
        b'"Start":"/zz\\u0000"',
        b'"\xc5\xbftart":"/zz\\u0000"',  # long s folds to "s" in Go
        b'"x":1',
    ],
)
def test_tokens_with_members_go_might_read_differently_are_the_apiservers(members: bytes) -> None:
    token = _b64(b'{"v":"meta.k8s.io/v1","rv":-1,"start":"/p\\u0000",' + members + b"}")
    assert decode_continue(token) is None


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        "!!!!",
        "a",  # impossible base64 length
        _b64(b"not json"),
        _b64(b"[1,2]"),
        _b64(b'{"v":"meta.k8s.io/v2","rv":42,"start":"/p\\u0000","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":0,"start":"/p\\u0000","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":-3,"start":"","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":-9223372036854775809,"start":"/p\\u0000"}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":"42","start":"/p\\u0000","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":42.0,"start":"/p\\u0000","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":true,"start":"/p\\u0000","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":42,"start":"","kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":42,"start":7,"kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":42,"kp":1}'),
        _b64(b'{"v":"meta.k8s.io/v1","rv":42,"start":"/p\\u0000","kp":2}'),
    ],
)
def test_garbage_is_not_a_kproxy_token(token: str) -> None:
    assert decode_continue(token) is None


@pytest.mark.parametrize(
    "start",
    ["/../kube-system/secret\x00", "/a/../b\x00", "/./a\x00", "//a\x00", "/a//b\x00", "/a/\x00/", "/a/"],
)
def test_start_keys_the_apiserver_calls_invalid_are_not_served(start: str) -> None:
    """``storage.DecodeContinue`` rejects a start key that ``path.Clean`` would change (400
    "continue key is not valid"); kproxy leaves such a token to the apiserver."""
    token = _b64(orjson.dumps({"v": "meta.k8s.io/v1", "rv": 42, "start": start, "kp": 1}))
    assert decode_continue(token) is None


def test_start_keys_path_clean_keeps_are_served() -> None:
    for start in ["/p\x00", "p\x00", "/ns/p\x00", "/", "/..x\x00", "/a.b/c\x00"]:
        token = _b64(orjson.dumps({"v": "meta.k8s.io/v1", "rv": 42, "start": start, "kp": 1}))
        assert decode_continue(token) == ContinueToken(42, start), start


def test_tokens_outside_the_raw_url_alphabet_are_the_apiservers_to_reject() -> None:
    """Go's RawURLEncoding refuses padding, "+", "/" and stray characters; Python's decoder
    would take them, so kproxy checks the alphabet itself."""
    good = encode_continue(42, "/p")
    assert decode_continue(good) is not None
    padded = good + "=" * (-len(good) % 4 or 4)
    assert decode_continue(padded) is None
    assert decode_continue(good[:5] + "." + good[5:]) is None
    assert decode_continue(good[:5] + " " + good[5:]) is None
    std = base64.b64encode(orjson.dumps({"v": "meta.k8s.io/v1", "rv": 42, "start": "/??>\x00", "kp": 1})).decode()
    assert "+" in std or "/" in std
    assert decode_continue(std.rstrip("=")) is None
