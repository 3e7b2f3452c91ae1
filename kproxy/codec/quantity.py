"""resource.Quantity's canonical string, as k8s.io/apimachinery/pkg/api/resource computes it.

The apiserver stores and prints quantities canonically ("1000m" -> "1", "1024Ki" -> "1Mi",
"0.5" -> "500m"), so JSON -> protobuf must canonicalise for a round trip to give the apiserver's
own text. Exact arithmetic with fractions mirrors ParseQuantity (round non-zero values up to
nano precision, away from zero; BinarySI below 1 becomes DecimalSI) and CanonicalizeBytes.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from .codecerrors import CodecError

_FORMAT = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_DEC_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DEC_OF_EXP = {v: k for k, v in _DEC_SUFFIX.items()}
_BIN_OF_EXP = {0: "", **{v: k for k, v in _BIN_SUFFIX.items()}}
_MAX_BINARY = 2**63 - 1

ERR_FORMAT = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def parse_quantity(text: str) -> tuple[Fraction, str]:
    """(exact value, format) with format one of DecimalSI, BinarySI, DecimalExponent."""
    s = text.strip()
    m = _FORMAT.match(s)
    if not s or m is None:
        raise CodecError(ERR_FORMAT)
    num, suffix = m.group(1), m.group(2)
    digits = num.lstrip("+-")
    if digits.count(".") > 1 or not any(c.isdigit() for c in digits):
        raise CodecError(ERR_FORMAT)
    if suffix in _DEC_SUFFIX:
        base, exp, fmt = 10, _DEC_SUFFIX[suffix], "DecimalSI"
    elif suffix in _BIN_SUFFIX:
        base, exp, fmt = 2, _BIN_SUFFIX[suffix], "BinarySI"
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        base, exp, fmt = 10, int(suffix[1:]), "DecimalExponent"
    else:
        raise CodecError("unable to parse quantity's suffix")
    try:
        value = Fraction(Decimal(num))
    except InvalidOperation as e:
        raise CodecError(ERR_FORMAT) from e
    value *= Fraction(base) ** exp
    if value:
        scaled = abs(value) * 10**9
        rounded = Fraction(math.ceil(scaled), 10**9)
        value = rounded if value > 0 else -rounded
    if fmt == "BinarySI" and value > _MAX_BINARY:
        value = Fraction(_MAX_BINARY)
    if fmt == "BinarySI" and 0 < value < 1:
        fmt = "DecimalSI"
    return value, fmt


def _remove_factors(v: int, base: int) -> tuple[int, int]:
    times = 0
    neg = v < 0
    v = abs(v)
    while v and v % base == 0:
        v //= base
        times += 1
    return (-v if neg else v), times


def format_quantity(value: Fraction, fmt: str) -> str:
    """Quantity.String(): CanonicalizeBytes."""
    if value == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < value < 1024 or value.denominator != 1:
            fmt = "DecimalSI"
        else:
            mantissa, times = _remove_factors(int(value), 1024)
            return f"{mantissa}{_BIN_OF_EXP.get(times * 10, '')}"
    mantissa, exponent = int(value * 10**9), -9
    mantissa, times = _remove_factors(mantissa, 10)
    exponent += times
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DEC_OF_EXP.get(exponent, '')}"


@functools.lru_cache(maxsize=4096)
def canonical_quantity(text: str) -> str:
    """The canonical form of a quantity string; CodecError if it does not parse (cached: a
    cluster's quantities are few distinct strings)."""
    return format_quantity(*parse_quantity(text))
