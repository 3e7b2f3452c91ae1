"""The ``fieldValidation`` levels (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go)."""

from __future__ import annotations

import enum


class Level(enum.IntEnum):
    """Ordered so that policy can only raise a level: ``max(requested, policy)``."""

    IGNORE = 0
    WARN = 1
    STRICT = 2

    @property
    def wire(self) -> str:
        return ("Ignore", "Warn", "Strict")[self]


_BY_NAME = {"Ignore": Level.IGNORE, "Warn": Level.WARN, "Strict": Level.STRICT, "": Level.WARN}


def parse_level(value: str | None) -> Level | None:
    """The level a ``fieldValidation`` value means; ``None`` for a value the apiserver rejects.

    Absent and empty both mean ``Warn``, the apiserver's default; matching is case-sensitive.
    """
    if value is None:
        return Level.WARN
    return _BY_NAME.get(value)
