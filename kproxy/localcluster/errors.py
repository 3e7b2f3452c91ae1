"""The exceptions of the local control plane (envtest): binaries, then the control plane itself."""

from __future__ import annotations

__all__ = ["ControlPlaneError", "EnvtestError"]


class EnvtestError(RuntimeError):
    """Binaries could not be found or built."""


class ControlPlaneError(EnvtestError):
    """The control plane could not be started, stopped or inspected."""
