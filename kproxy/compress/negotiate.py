"""``Accept-Encoding`` as RFC 9110 section 12.5.3 defines it.

The apiserver reads only the first header line and looks for the exact token ``gzip`` (no
q-values, case-sensitive). kproxy reads every line, compares codings case-insensitively, honours
q-values (``gzip;q=0`` refuses gzip), ``*`` (any coding not named) and ``identity``, treats
``x-gzip`` as ``gzip`` (RFC 9110 section 8.4.1.3) and ignores codings it does not know. Ties are
broken by the operator's preference order.

No header at all means "no compression": that is how ``kubectl --disable-compression`` and a
kubeconfig's ``disable-compression: true`` opt out (client-go then sends no Accept-Encoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_ALIASES = {"x-gzip": "gzip"}


@dataclass(frozen=True, slots=True)
class Negotiated:
    """The outcome for one request.

    ``coding`` is the coding to use (None: send the body as it is). ``identity_ok`` is False
    when the client refused an uncompressed body (``identity;q=0`` or ``*;q=0``); kproxy then
    compresses even bodies under the size threshold when it can.
    """

    coding: str | None
    identity_ok: bool = True


NONE = Negotiated(None)


def parse(values: Iterable[str]) -> dict[str, float]:
    """Every ``coding[;q=x]`` element of the given header lines -> its q-value (lower-case
    codings; a malformed q-value counts as 0, so a broken element never selects a coding)."""
    out: dict[str, float] = {}
    for value in values:
        for element in value.split(","):
            name, _, params = element.partition(";")
            coding = name.strip().lower()
            if not coding:
                continue
            coding = _ALIASES.get(coding, coding)
            q = 1.0
            for param in params.split(";"):
                key, _, val = param.partition("=")
                if key.strip().lower() == "q":
                    q = _qvalue(val.strip())
            # The same coding named twice: the most favourable mention counts.
            out[coding] = max(q, out.get(coding, -1.0))
    return out


def _qvalue(text: str) -> float:
    """RFC 9110 ``qvalue``: 0 to 1 with at most three decimals; anything else is 0."""
    try:
        q = float(text)
    except ValueError:
        return 0.0
    return q if 0.0 <= q <= 1.0 else 0.0


def negotiate(values: Sequence[str], offered: Sequence[str]) -> Negotiated:
    """Pick a coding from ``offered`` (in preference order) for these Accept-Encoding lines."""
    if not values:
        return NONE
    accepted = parse(values)
    star = accepted.get("*")
    # identity is acceptable unless refused by name or by "*;q=0" (RFC 9110 12.5.3); only an
    # explicit q-value for it (or for "*") can rank it above a compressed coding.
    identity_q = accepted.get("identity", star)
    identity_ok = identity_q is None or identity_q > 0
    best: str | None = None
    best_q = 0.0
    for coding in offered:
        q = accepted.get(coding, star if star is not None else 0.0)
        if q > best_q:  # strictly greater: earlier (preferred) codings win ties
            best, best_q = coding, q
    if best is not None and identity_q is not None and best_q < identity_q:
        # The client prefers the body as it is (e.g. "identity, gzip;q=0.5").
        return Negotiated(None, True)
    return Negotiated(best, identity_ok)
