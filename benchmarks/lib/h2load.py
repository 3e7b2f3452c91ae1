"""nghttp2's ``h2load`` as the C load generator of the request benchmarks (where a Python load
generator's own CPU would hide the difference between peers): its command line and its summary.

``h2load`` is closed loop: ``-c`` connections, each carrying at most ``-m`` concurrent streams (over
HTTP/1.1 one request at a time per connection), each sending its next request when an answer is
complete; ``-D S`` measures S seconds (after ``--warm-up-time``), ``-n N`` sends N requests.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_REQ = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored")
_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_TRAFFIC = re.compile(r"traffic: .*? \((\d+)\) total, .*? \((\d+)\) headers .*?, .*? \((\d+)\) data")
_TIME = re.compile(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)")


def argv(
    url: str, h1: bool, connections: int, streams: int, extra: Sequence[str] = (), headers: Sequence[str] = ()
) -> list[str]:
    """``h2load`` asking ``url`` over HTTP/1.1 (``h1``) or h2 (ALPN ``h2`` only), with ``headers``
    (``"Name: value"``) and ``extra`` arguments."""
    out = ["h2load", "-c", str(connections), "-m", str(streams)]
    for h in headers:
        out += ["-H", h]
    out += list(extra)
    out += ["--h1"] if h1 else ["--npn-list", "h2"]
    return [*out, url]


@dataclass
class Summary:
    """What ``h2load`` printed at the end of a run."""

    #: the ``requests:`` line: total, started, done, succeeded, failed, errored
    done: int
    succeeded: int
    failed: int
    errored: int
    #: the ``status codes:`` line
    status_2xx: int
    status_other: int
    #: bytes of response bodies (the ``data`` of ``traffic:``), None when not printed
    data_bytes: int | None
    #: mean time for a request in ms (``time for request:``), NaN when not printed
    mean_ms: float
    #: the two lines, as printed, for a report of what failed
    lines: str


def _ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1000.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float("nan")


def parse(text: str) -> Summary | None:
    """The summary of ``h2load``'s output; None when it has no ``requests:`` and ``status codes:``
    lines (it did not run)."""
    req, status = _REQ.search(text), _STATUS.search(text)
    if not req or not status:
        return None
    traffic, lat = _TRAFFIC.search(text), _TIME.search(text)
    return Summary(
        done=int(req.group(3)),
        succeeded=int(req.group(4)),
        failed=int(req.group(5)),
        errored=int(req.group(6)),
        status_2xx=int(status.group(1)),
        status_other=sum(int(status.group(i)) for i in (2, 3, 4)),
        data_bytes=int(traffic.group(3)) if traffic else None,
        mean_ms=_ms(lat.group(3)) if lat else float("nan"),
        lines=f"{status.group(0)}; {req.group(0)}",
    )
