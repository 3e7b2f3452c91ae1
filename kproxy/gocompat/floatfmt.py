"""Go's shortest float formatting, where kproxy must write a float64 exactly as Go does
(field selector values of custom resources, YAML made from JSON by sigs.k8s.io/yaml)."""

from __future__ import annotations

from decimal import Decimal


def format_float_g(value: float) -> str:
    """strconv.FormatFloat(f, 'g', -1, 64) (also %v of a float64): the shortest digits (Python's repr finds
    the same ones), exponent form when the decimal exponent is below -4 or at least 6 (ftoa.go: "if
    precision was the shortest possible, use precision 6 for this decision"), e.g. 1e+06, 1.5e-05."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    dp = len(digit_tuple) + exponent  # position of the decimal point after the first digit string
    neg = "-" if sign else ""
    exp = dp - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{neg}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if dp <= 0:
        return f"{neg}0.{'0' * -dp}{digits}"
    if dp >= len(digits):
        return f"{neg}{digits}{'0' * (dp - len(digits))}"
    return f"{neg}{digits[:dp]}.{digits[dp:]}"
