"""The fuzzer's generator alone (no cluster): every request of a long run can be built, and a
request is the same bytes whenever its seed and index are the same (what makes a report a repro)."""

from __future__ import annotations

from .fuzz import TOKEN, WSTOKEN, generate


def test_generator_builds_every_request_and_is_reproducible() -> None:
    first = [generate(7, i).render("fzk-abcdef", f"fz{i}") for i in range(20_000)]
    assert [generate(7, i).render("fzk-abcdef", f"fz{i}") for i in range(0, 20_000, 97)] == first[::97]
    assert len(set(first)) > 15_000  # mutations, not one request over and over


def test_identity_generator_reaches_every_reading() -> None:
    """The identity generator is reproducible, and its requests reach each way the apiserver's
    authenticators read a caller (kproxy.identity.authn.caller_tokens, checked against the
    apiserver's own code in tests/unit/gocompat/test_gocompat_strings.py): a token in
    Authorization, in the WebSocket protocol, both, none, a failed protocol; spellings Python's
    str.strip or str.lower would read otherwise."""
    from multidict import CIMultiDict

    from kproxy.identity.authn import caller_tokens

    reqs = [generate(7, i, "identity") for i in range(5000)]
    assert [generate(7, i, "identity").render("fzk-abcdef", f"fz{i}", "tok") for i in range(0, 5000, 97)] == [
        r.render("fzk-abcdef", f"fz{i}", "tok") for i, r in list(enumerate(reqs))[::97]
    ]
    outcomes: dict[str, int] = {}
    for r in reqs:
        headers = [(k, v.replace(TOKEN, "tok").replace(WSTOKEN, "dG9r")) for k, v in r.headers]
        tokens, failed = caller_tokens(CIMultiDict(headers))
        found = [t for t, _ in tokens if t == "tok"]
        by_ws = [t for t, ws in tokens if ws]
        key = "failed" if failed else "ws" if by_ws else "authorization" if found else "none"
        outcomes[key] = outcomes.get(key, 0) + 1
        lines = "".join(v for _, v in r.headers)
        if found and any(c in lines for c in "\u2003\u3000\u2028\u1680\u205f\u017f\u212a"):
            outcomes["unicode-spelling"] = outcomes.get("unicode-spelling", 0) + 1
    wanted = ("failed", "ws", "authorization", "none", "unicode-spelling")
    assert min(outcomes.get(k, 0) for k in wanted) > 100, outcomes
