"""Building the small Go programs the tests drive, once per source version.

Each program is its own Go module under the repository (``tests/e2e/informer``, ``tools/gooracle``).
Its binary is cached under ``~/.cache/kproxy/<name>/<hash of go.mod, go.sum and its .go files>/`` so only a
change to the program rebuilds it; the build uses the control plane's Go settings
(``tools/envtest/build.sh``: the Go module proxy, no cgo).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

from kproxy.localcluster.binaries import CACHE_ROOT
from kproxy.localcluster.errors import EnvtestError

__all__ = ["ensure_go_binary"]

def _digest(source: Path) -> str:
    h = hashlib.sha256()
    names = ["go.mod", "go.sum", *sorted(p.name for p in source.glob("*.go"))]
    for name in names:
        path = source / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()[:16]


def ensure_go_binary(source: Path, name: str) -> Path:
    """The binary of the Go module in ``source`` for its current sources, built once (under a
    lock, so parallel test runs build it once) and reused after."""
    directory = CACHE_ROOT.parent / name / _digest(source)
    binary = directory / name
    if os.access(binary, os.X_OK):
        return binary
    directory.mkdir(parents=True, exist_ok=True)
    with open(f"{directory}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):  # built by someone else while we waited
            return binary
        tmp = directory / f".{name}.{os.getpid()}"
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly -buildvcs=false"}
        try:
            done = subprocess.run(
                ["go", "build", "-trimpath", "-o", str(tmp), "."],
                cwd=source,
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EnvtestError(f"cannot build the Go program in {source}: {e}") from e
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise EnvtestError(f"go build in {source} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        tmp.replace(binary)
    return binary
