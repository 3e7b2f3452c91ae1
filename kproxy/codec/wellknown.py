"""Kubernetes' JSON forms of its special Go types (metav1.Time, MicroTime, Duration...).

Each matches the type's MarshalJSON/UnmarshalJSON in k8s.io/apimachinery: Time is RFC 3339 in UTC
truncated to seconds (its proto nanos are ignored, as time_proto.go does), MicroTime keeps
microseconds, Duration prints Go's time.Duration.String().
"""

from __future__ import annotations

import calendar
import re
import time

from .codecerrors import CodecError

# Go's zero time.Time (0001-01-01T00:00:00Z) as Unix seconds: IsZero() is true, JSON is null.
GO_ZERO_UNIX = -62135596800

_time_cache: dict[int, str] = {}


def format_time(seconds: int) -> str:
    """metav1.Time's JSON string for Unix seconds (cached: list items share timestamps)."""
    s = _time_cache.get(seconds)
    if s is None:
        if len(_time_cache) > 8192:
            _time_cache.clear()
        try:
            tm = time.gmtime(seconds)
        except (OverflowError, OSError, ValueError) as e:
            raise CodecError(f"Time.MarshalJSON: time {seconds} out of range") from e
        if not 0 <= tm.tm_year <= 9999:
            raise CodecError("Time.MarshalJSON: year outside of range [0,9999]")
        s = f"{tm[0]:04d}-{tm[1]:02d}-{tm[2]:02d}T{tm[3]:02d}:{tm[4]:02d}:{tm[5]:02d}Z"
        _time_cache[seconds] = s
    return s


def format_micro_time(seconds: int, nanos: int) -> str:
    """metav1.MicroTime's JSON string: RFC 3339 with exactly six fractional digits, UTC."""
    base = format_time(seconds)
    return f"{base[:-1]}.{nanos // 1000:06d}Z"


_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


def parse_time(value: str) -> tuple[int, int]:
    """An RFC 3339 string (as Go's time.Parse(RFC3339) accepts it) -> (Unix seconds, nanos)."""
    m = _RFC3339.match(value)
    if m is None:
        raise CodecError(f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse')
    year, month, day, hour, minute, sec = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and sec < 60):
        raise CodecError(f'parsing time "{value}": out of range')
    frac = m.group(7) or ""
    nanos = int(frac.ljust(9, "0")) if frac else 0
    secs = calendar.timegm((year, month, day, hour, minute, sec, 0, 0, 0))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        secs -= offset if m.group(9) == "+" else -offset
    return secs, nanos


def _frac(v: int, prec: int) -> str:
    whole, frac = divmod(v, 10**prec)
    digits = f"{frac:0{prec}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def format_duration(ns: int) -> str:
    """Go's time.Duration.String(): "1h2m3.5s", "1.5ms", "0s"."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = -ns if ns < 0 else ns
    if u < 1_000_000_000:
        if u < 1000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{_frac(u, 3)}µs"
        return f"{sign}{_frac(u, 6)}ms"
    total, frac = divmod(u, 1_000_000_000)
    digits = f"{frac:09d}".rstrip("0")
    out = f"{total % 60}{'.' + digits if digits else ''}s"
    if total >= 60:
        out = f"{(total // 60) % 60}m{out}"
        if total >= 3600:
            out = f"{total // 3600}h{out}"
    return sign + out


_UNITS = {"ns": 1, "us": 1000, "µs": 1000, "μs": 1000, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_DUR_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(value: str) -> int:
    """Go's time.ParseDuration -> nanoseconds."""
    s = value
    sign = 1
    if s[:1] in "+-" and s:
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise CodecError(f'time: invalid duration "{value}"')
    total = 0
    pos = 0
    while pos < len(s):
        m = _DUR_PART.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            raise CodecError(f'time: invalid duration "{value}"')
        num = m.group(1)
        whole, _, frac = num.partition(".")
        unit = _UNITS[m.group(2)]
        total += int(whole or "0") * unit
        if frac:
            total += int(frac) * unit // 10 ** len(frac)
        pos = m.end()
    return sign * total
