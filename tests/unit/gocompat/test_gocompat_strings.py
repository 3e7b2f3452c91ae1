"""kproxy.gocompat.strings and the apiserver's token finders in kproxy.identity.authn, against Go
itself (tools/gooracle), input for input.

Who the caller is and whether a request is an upgrade are decided from header bytes the caller
writes; each difference between kproxy's reading and Go's is a spelling that names one caller to
kproxy's policy and another to the apiserver. The oracle runs Go's own strings, unicode, base64
and httpguts, and the apiserver's own bearertoken, websocket protocol and union authenticators and
k8s.io/streaming's IsWebSocketRequest/IsUpgradeRequest. Inputs cover all of Unicode's white space
(Go's and Python's, which differ), the case-folding specials, bytes that are not UTF-8 (lone,
truncated, overlong, surrogate, beyond U+10FFFF) and seeded random strings built from them."""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator

import pytest
from multidict import CIMultiDict

from kproxy.core.negotiation import media_type_of
from kproxy.gocompat import strings
from kproxy.gocompat._unicodetables import FOLD, LOWER, SPACE
from kproxy.identity.authn import (
    bearer_token,
    caller_tokens,
    is_upgrade_request,
    is_websocket_request,
    protocol_token,
    without_token_protocol,
)
from kproxy.server.httputil import connection_tokens, is_upgrade
from kproxy.testing.gooracle import REPO_ROOT, GoOracle, b64, unicode_tables_source

SEED = 27
PREFIX = "base64url.bearer.authorization.k8s.io."


@pytest.fixture(scope="module")
def go() -> Iterator[GoOracle]:
    oracle = GoOracle()
    yield oracle
    oracle.close()


def text(raw: bytes) -> str:
    """Header bytes as kproxy holds them (UTF-8 with surrogateescape)."""
    return raw.decode("utf-8", "surrogateescape")


#: Go's white space, Python's (str.isspace adds U+001C-U+001F; U+180E, U+200B and U+FEFF are
#: neither's but look like it), and their neighbours.
SPACES = [chr(c) for c in SPACE] + [chr(c) for c in (0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0xFEFF, 0x2060, 0x8)]
#: Runes whose case folding is not ASCII's: the long s, Kelvin, Turkish I's, titlecase digraphs,
#: the three sigmas, sharp s (both), Ohm, Angstrom, micro, ligatures, iota subscript.
FOLDS = list(
    "\u017f\u004b\u0130\u0131\u01c5\u01c4\u01c6\u03a3\u03c3\u03c2\u00df\u1e9e\u03a9\u03c9\u00c5\u00e5\u00b5\u03bc"
    "\u039c\ufb00\u0149\u01f0\u0390\u1fb3\u0345\u03b9\u0399\u1e9b\u03b8\u03d1\u03f4\u212a\u2126\u212b"
)
#: Bytes Go reads as utf8.RuneError: lone and truncated, overlong, surrogates, beyond U+10FFFF;
#: and a real U+FFFD, which equals them under EqualFold.
INVALID = [
    text(b)
    for b in (
        b"\xff",
        b"\xfe",
        b"\x80",
        b"\xc2",
        b"\xe3\x80",
        b"\xc0\xaf",
        b"\xc1\xbf",
        b"\xe0\x80\xaf",
        b"\xf0\x80\x80\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x80\x83"[:2],
    )
] + ["\ufffd"]
WORDS = ["bearer", "Bearer", "BEARER", "websocket", "WebSocket", "upgrade", "Upgrade", "keep-alive", "x", "k", "s"]
ALPHABET = SPACES + FOLDS + INVALID + list("abcdeiknoprstuwgABEIKSRUW -_,=+/\t") + ["\u00e9", "\u4e2d", "\U0001f600"]


def canonical(s: str) -> str:
    """``s`` as kproxy would hold its bytes: pieces of invalid UTF-8 may join into a valid rune."""
    return text(s.encode("utf-8", "surrogateescape"))


def rand_string(rng: random.Random, n: int) -> str:
    return canonical("".join(rng.choice(ALPHABET) for _ in range(rng.randrange(n))))


#: Look-alikes of ASCII letters: the ones Go folds into them (U+017F, U+212A) and ones it does not.
NEAR = {
    "s": "\u017f",
    "k": "\u212a",
    "i": "\u0130\u0131",
    "e": "\u0395\u0415\u00e9",
    "a": "\u0391\u0430",
    "b": "\u0392",
    "p": "\u03c1\u0440",
    "o": "\u03bf\u043e",
    "c": "\u0441\u03f2",
}


def variants(word: str, rng: random.Random) -> str:
    """``word`` as is, with its case changed, or with a letter or two replaced by a look-alike
    (folding to it in Go or not), and perhaps white space around it."""
    chars = [c.swapcase() if rng.random() < 0.3 else c for c in word]
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        i = rng.randrange(len(chars))
        chars[i] = rng.choice(NEAR.get(chars[i].lower(), "") or FOLDS) if rng.random() < 0.8 else rng.choice(FOLDS)
    pads = [rng.choice(SPACES + INVALID) if rng.random() < 0.3 else "" for _ in range(2)]
    return canonical(pads[0] + "".join(chars) + pads[1])


def string_inputs(count: int) -> list[str]:
    rng = random.Random(SEED)
    fixed = [c for c in ALPHABET] + [a + "x" + b for a in SPACES + INVALID for b in SPACES + INVALID[:3]]
    fixed += [s + w + s for w in WORDS for s in SPACES]
    fixed = [canonical(f) for f in fixed]
    fixed += [rand_string(rng, 12) for _ in range(count)]
    return fixed + [variants(rng.choice(WORDS), rng) for _ in range(count)]


def test_unicode_tables_are_the_go_toolchains(go: GoOracle) -> None:
    """kproxy/gocompat/_unicodetables.py is what the Go the control plane is built with has."""
    assert (REPO_ROOT / "kproxy" / "gocompat" / "_unicodetables.py").read_text() == unicode_tables_source(go)


def test_tables_differ_from_python() -> None:
    """Why the tables are Go's: Python's white space and case mappings are other functions."""
    assert "\u001c".isspace() and not strings.is_space("\u001c")
    assert "\u0130".lower() != strings.to_lower("\u0130") == "i"
    assert (
        "\u0391\u03a3".lower() == "\u03b1\u03c2" and strings.to_lower("\u0391\u03a3") == "\u03b1\u03c3"
        # Python lowers a final sigma to U+03C2 (context); Go's ToLower has no context.
    )
    assert not strings.equal_fold("\u00df", "ss") and "\u00df".casefold() == "ss"
    assert len(LOWER) > 100 and len(FOLD) > 100


def test_trim_space(go: GoOracle) -> None:
    inputs = string_inputs(1500)
    for s, want in zip(inputs, go.ask_many("trimspace", inputs), strict=True):
        assert strings.trim_space(s).encode("utf-8", "surrogateescape") == b64(want["out"]), repr(s)


def test_to_lower(go: GoOracle) -> None:
    inputs = string_inputs(1500) + ["".join(map(chr, range(lo, lo + 256))) for lo in range(0, 0x3000, 256)]
    for s, want in zip(inputs, go.ask_many("tolower", inputs), strict=True):
        assert strings.to_lower(s).encode("utf-8", "surrogateescape") == b64(want["out"]), repr(s)


def test_equal_fold(go: GoOracle) -> None:
    rng = random.Random(SEED)
    pairs = [(a, b) for a in FOLDS + INVALID + list("sSkKiI") for b in FOLDS + INVALID + list("sSkKiI")]
    # Every rune Go folds, against what it folds to and against its ASCII lower and upper case.
    pairs += [(chr(r), chr(r + d)) for first, last, stride, d in FOLD for r in range(first, last + 1, stride)]
    for w in WORDS:
        pairs += [(variants(w, rng).strip(), w) for _ in range(60)]
    pairs += [(rand_string(rng, 6), rand_string(rng, 6)) for _ in range(800)]
    for (s, t), want in zip(pairs, go.ask_many("equalfold", pairs), strict=True):
        assert strings.equal_fold(s, t) == want["eq"], (s, t)


def test_split(go: GoOracle) -> None:
    """strings.Split with an ASCII separator is str.split (what authn.py uses for "," and " ")."""
    inputs = string_inputs(500)
    for s, want in zip(inputs, go.ask_many("split", [(s, ",") for s in inputs]), strict=True):
        assert [p.encode("utf-8", "surrogateescape") for p in s.split(",")] == [b64(p) for p in want["out"]]


def test_raw_url_decode(go: GoOracle) -> None:
    rng = random.Random(SEED)
    alphabet = [*list("AZaz09-_+/=\r\n ."), "é", text(b"\xff"), "\u3000"]
    inputs = ["", "YQ", "YWI", "YWJj", "YWJjZA", "YQ==", "YQ=", "Y", "YWJjZ", "_-8", "+/8", "YW\r\nJj", "Y\nWJjZA"]
    inputs += [base64.urlsafe_b64encode(rng.randbytes(rng.randrange(9))).decode().rstrip("=") for _ in range(300)]
    inputs += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(10))) for _ in range(1200)]
    for s, want in zip(inputs, go.ask_many("rawurl", inputs), strict=True):
        got = strings.raw_url_decode(s)
        assert (got is None) == want["err"], repr(s)
        if got is not None:
            assert got == b64(want["out"]), repr(s)


def test_header_values_contain_token(go: GoOracle) -> None:
    rng = random.Random(SEED)
    values = [[variants("upgrade", rng)] for _ in range(600)]
    values += [[variants("keep-alive", rng) + "," + variants("upgrade", rng), rand_string(rng, 5)] for _ in range(400)]
    values += [[rand_string(rng, 10)] for _ in range(300)]
    for vs, want in zip(values, go.ask_many("containstoken", [["Upgrade", *vs] for vs in values]), strict=True):
        assert strings.header_values_contain_token(vs, "Upgrade") == want["in"], vs


def token_protocol(token: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def header_sets(count: int) -> list[list[tuple[str, str]]]:
    """Requests a caller may write: Authorization spellings, several Authorization lines, the
    WebSocket bearer protocol in every spelling, Upgrade and Connection spellings."""
    rng = random.Random(SEED)
    sets: list[list[tuple[str, str]]] = []
    for _ in range(count):
        h: list[tuple[str, str]] = []
        for _ in range(rng.choice((0, 1, 1, 2))):
            token = rng.choice(("tok", "badtok", "", "a b", rand_string(rng, 4)))
            scheme = variants("Bearer", rng) if rng.random() < 0.7 else rand_string(rng, 7)
            sep = rng.choice((" ", "  ", "\t", "\u3000", " " + rng.choice(SPACES)))
            h.append((rng.choice(("Authorization", "authorization")), scheme + sep + token + rng.choice([*SPACES, ""])))
        if rng.random() < 0.8:
            h.append(("Upgrade", variants("websocket", rng) if rng.random() < 0.8 else rand_string(rng, 6)))
        for _ in range(rng.choice((0, 1, 1, 2))):
            conn = rng.choice(("Upgrade", "keep-alive, Upgrade", "upgrades", "x,upgrade", "close"))
            h.append(("Connection", variants(conn, rng) if rng.random() < 0.5 else conn))
        for _ in range(rng.choice((0, 1, 1, 2))):
            entries = []
            if rng.random() < 0.5:  # the layout clients send: a channel protocol and the token
                entries += ["v4.channel.k8s.io", token_protocol(rng.choice(("ws-tok", "badws")))]
            for _ in range(rng.randrange(3)):
                r = rng.random()
                if r < 0.2:
                    entries.append(token_protocol(rng.choice(("ws-tok", "badws", "x\u00e9"))))
                elif r < 0.5:
                    entries.append(PREFIX + rng.choice(("YQ==", "Y", "+/8", "_w", "", text(b"\xff"))))
                elif r < 0.55:
                    entries.append(PREFIX + base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="))
                else:
                    entries.append(rng.choice(("v4.channel.k8s.io", "x", "", rand_string(rng, 4))))
            rng.shuffle(entries)
            sep = lambda: "," + rng.choice(["", " ", "\t", *SPACES])  # noqa: E731
            h.append(("Sec-WebSocket-Protocol", "".join(sep() + e if i else e for i, e in enumerate(entries))))
        rng.shuffle(h)
        sets.append(h)
    return sets


def kproxy_union(headers: CIMultiDict[str]) -> tuple[bool, bool, bytes, list[bytes] | None]:
    """kproxy's reading with the oracle's token authenticator (accepts tokens not starting "bad"):
    (ok, err, token, Sec-WebSocket-Protocol after)."""
    tokens, failed = caller_tokens(headers)
    for token, by_protocol in tokens:
        if not token.startswith("bad"):
            after = headers.copy()
            if by_protocol:
                without_token_protocol(after)
            return True, False, token.encode("utf-8", "surrogateescape"), protocols(after)
        failed = True
    return False, failed, b"", protocols(headers)


def protocols(headers: CIMultiDict[str]) -> list[bytes] | None:
    values = headers.getall("Sec-WebSocket-Protocol", None)
    return None if values is None else [v.encode("utf-8", "surrogateescape") for v in values]


def test_request_authentication_is_the_apiservers(go: GoOracle) -> None:
    """IsWebSocketRequest, IsUpgradeRequest, bearertoken, the WebSocket protocol authenticator and
    their union, with kproxy's ports on the same header lines."""
    sets = header_sets(4000)
    answers = go.ask_many("request", [[x for pair in h for x in pair] for h in sets])
    seen = {"union-ok": 0, "union-err": 0, "ws": 0, "ws-token": 0}
    for h, want in zip(sets, answers, strict=True):
        headers: CIMultiDict[str] = CIMultiDict(h)
        assert is_websocket_request(headers) == want["websocket"], h
        assert is_upgrade_request(headers) == want["upgrade"], h
        token = bearer_token(headers.get("Authorization", ""))
        b = want["bearer"]
        assert (token is not None and not token.startswith("bad")) == b["ok"], h
        assert (token is not None and token.startswith("bad")) == b["err"], h
        if b["ok"]:
            assert token is not None and token.encode("utf-8", "surrogateescape") == b64(b["token"])
        p = want["protocol"]
        if want["websocket"]:
            ws, failed, _ = protocol_token(headers.getall("Sec-WebSocket-Protocol", []))
            assert (ws is not None and not ws.startswith("bad")) == p["ok"], h
            assert (failed or (ws is not None and ws.startswith("bad"))) == p["err"], h
        else:
            assert not p["ok"] and not p["err"]
        u = want["union"]
        ok, err, tok, after = kproxy_union(headers)
        assert (ok, err) == (u["ok"], u["err"]), h
        if ok:
            assert tok == b64(u["token"]), h
            assert after == ([b64(v) for v in u["protocols"]] if u["protocols"] is not None else None), h
        seen["union-ok"] += ok
        seen["union-err"] += err
        seen["ws"] += want["websocket"]
        seen["ws-token"] += p["ok"]
    assert min(seen.values()) > 30, seen  # the generator reaches every outcome


def test_kproxy_upgrade_is_is_upgrade_request(go: GoOracle) -> None:
    """kproxy forwards Connection and Upgrade when the apiserver's IsUpgradeRequest would see an
    upgrade (and there is an Upgrade to ask for); connection_tokens names what Go's ReverseProxy
    removes (ASCII case only)."""
    sets = header_sets(800)
    answers = go.ask_many("request", [[x for pair in h for x in pair] for h in sets])
    for h, want in zip(sets, answers, strict=True):
        headers: CIMultiDict[str] = CIMultiDict(h)
        assert is_upgrade(headers) == (want["upgrade"] and bool(headers.get("Upgrade"))), h
    assert connection_tokens(CIMultiDict([("Connection", "\u212aeep-Alive, Upgrade ,x\u3000")])) == {"upgrade"}


def test_media_type_is_mime_parse_media_type(go: GoOracle) -> None:
    """The Content-Type media type kproxy's filters select on (JSON and YAML are Strict-validated,
    others passed to the apiserver) is the one the apiserver decodes by (mime.ParseMediaType:
    strings.ToLower then strings.TrimSpace; U+0130 lowers to "i", U+212A to "k")."""
    rng = random.Random(SEED)
    types = ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "application/cbor"]
    params = ["", "; charset=utf-8", ";stream=watch"]
    inputs = [variants(rng.choice(types), rng) + rng.choice(params) for _ in range(1500)]
    inputs += ["appl\u0130cation/json", "application/vnd.\u212aubernetes.protobuf", "\u3000application/yaml\u2003"]
    for v, want in zip(inputs, go.ask_many("mediatype", inputs), strict=True):
        if not want["err"]:  # the apiserver refuses the others (415) before any filter's choice matters
            got = media_type_of(v).partition(";")[0]
            assert got.encode("utf-8", "surrogateescape") == b64(want["type"]), repr(v)
