"""The ``dryrun`` filter's settings: its rules, in order (``DryRunRule``, ``DryRunSettings``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from kproxy.identity.policy import Rule

__all__ = ["DryRunRule", "DryRunSettings"]


class DryRunRule(Rule):
    """A policy rule with what to do with the mutating requests it matches."""

    action: Literal["enforce", "reject", "allow"]


class DryRunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Evaluated in order; the first match decides. No match = the request passes unchanged.
    rules: list[DryRunRule]
