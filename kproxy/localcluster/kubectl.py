"""Running the envtest-built kubectl against a kubeconfig."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Kubectl", "KubectlError"]


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl run whose message includes stderr (CalledProcessError's omits it)."""

    def __str__(self) -> str:
        stderr = self.stderr if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}\nstderr:\n{stderr.strip()}"


@dataclass(frozen=True)
class Kubectl:
    """Runs the envtest-built kubectl (same release as the apiserver) against a kubeconfig.

    ``kubeconfig`` defaults to the admin one; pass any other (the user one, or
    one pointing at kproxy).  Discovery is cached under ``cache_dir`` rather
    than ``~/.kube/cache`` to keep runs hermetic.
    """

    binary: Path
    default_kubeconfig: Path
    cache_dir: Path

    def run(
        self,
        args: Sequence[str],
        *,
        kubeconfig: Path | str | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        config = str(kubeconfig or self.default_kubeconfig)
        argv = [str(self.binary), f"--kubeconfig={config}", f"--cache-dir={self.cache_dir}", *args]
        env = dict(os.environ, KUBECONFIG=config)
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    __call__ = run

    def json(self, args: Sequence[str], *, kubeconfig: Path | str | None = None, timeout: float = 60.0) -> Any:
        """Run ``kubectl ARGS -o json`` (check=True) and parse stdout."""
        return json.loads(self.run([*args, "-o", "json"], kubeconfig=kubeconfig, timeout=timeout).stdout)
