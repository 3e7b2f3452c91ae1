"""The control-plane binaries (etcd, kube-apiserver, kubectl): which release, where, and building them.

Next to them (:data:`EXTRA_BINARIES`, not needed by the control plane itself): kube-controller-manager,
kube-scheduler and KWOK for the living cluster, and ``standin-kubelet`` (tools/envtest/standin-kubelet),
which serves the kubelet's exec, attach and port-forward endpoints for the end-to-end tests. A cache built
before one of them existed stays usable and gets just what it lacks (:func:`ensure_extra`).

Binaries are built from source by ``tools/envtest/build.sh`` at the Kubernetes
release pinned in ``tools/envtest/go.mod`` and cached under
``~/.cache/kproxy/envtest/<version>/``; nothing is downloaded at test time.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kproxy.localcluster.errors import EnvtestError

__all__ = [
    "BINARIES",
    "BIN_DIR_ENV",
    "EXTRA_BINARIES",
    "KWOK_STAGES",
    "STANDIN_KUBELET",
    "BinPaths",
    "default_cache_dir",
    "ensure_binaries",
    "ensure_extra",
    "ensure_standin_kubelet",
    "k8s_version",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
ENVTEST_TOOL_DIR = REPO_ROOT / "tools" / "envtest"
#: Built binaries live outside the clone (as in the Makefile), so fresh clones and CI reuse them.
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kproxy" / "envtest"

#: A directory holding prebuilt ``etcd``, ``kube-apiserver`` and ``kubectl``; skips the build.
BIN_DIR_ENV = "KPROXY_ENVTEST_BIN_DIR"

BINARIES = ("etcd", "kube-apiserver", "kubectl")
#: The stand-in kubelet's file name in the same directory (not required by the control plane).
STANDIN_KUBELET = "standin-kubelet"
#: Built next to the control plane but not needed by it: the controllers and KWOK of the living cluster
#: (:mod:`kproxy.localcluster.cluster`) and the stand-in kubelet.  A cache lacking some gets just those.
EXTRA_BINARIES = ("kube-controller-manager", "kube-scheduler", "kwok", STANDIN_KUBELET)
#: KWOK's stage definitions (nodes Ready with leases; the pod lifecycle), written by build.sh next to ``kwok``.
KWOK_STAGES = "kwok-stages.yaml"


# --------------------------------------------------------------------------- version pin


def _strip_comment(line: str) -> str:
    return line.split("//", 1)[0].strip()


def k8s_version(go_mod: Path | None = None) -> str:
    """The ``k8s.io/kubernetes`` version pinned in ``tools/envtest/go.mod`` (e.g. ``v1.37.1``).

    go.mod is parsed rather than asking ``go list`` so this works without a Go
    toolchain (prebuilt binaries, CI caches).  The module is only used through
    ``tool`` directives, so it appears in a ``require`` block (often marked
    ``// indirect``); a ``replace`` of it to another version wins, as in Go.
    """
    path = go_mod or ENVTEST_TOOL_DIR / "go.mod"
    try:
        text = path.read_text()
    except OSError as e:
        raise EnvtestError(f"cannot read the envtest version pin: {e}") from e
    module = "k8s.io/kubernetes"
    required: str | None = None
    replaced: str | None = None
    block: str | None = None
    for raw in text.splitlines():
        line = _strip_comment(raw)
        if not line:
            continue
        if block is not None:
            if line == ")":
                block = None
                continue
            directive, rest = block, line
        else:
            directive, _, rest = line.partition(" ")
            rest = rest.strip()
            if rest == "(":
                block = directive
                continue
        if directive == "require":
            parts = rest.split()
            if len(parts) >= 2 and parts[0] == module:
                required = parts[1]
        elif directive == "replace":
            old, arrow, new = rest.partition("=>")
            if arrow and old.split() and old.split()[0] == module:
                target = new.split()
                # "=> ../local/path" has no version: the require line still names the release.
                if len(target) == 2:
                    replaced = target[1]
    version = replaced or required
    if not version or not re.fullmatch(r"v\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.+-]*)?", version):
        raise EnvtestError(f"no usable {module} version found in {path} (got {version!r})")
    return version


# --------------------------------------------------------------------------- binaries


@dataclass(frozen=True)
class BinPaths:
    """Where the three control-plane binaries are, and which release they were built from."""

    dir: Path
    etcd: Path
    kube_apiserver: Path
    kubectl: Path
    version: str | None
    standin_kubelet: Path | None = None

    @classmethod
    def in_dir(cls, directory: Path) -> BinPaths:
        directory = directory.absolute()
        version_file = directory / "VERSION"
        version = version_file.read_text().strip() if version_file.is_file() else None
        return cls(
            dir=directory,
            etcd=directory / "etcd",
            kube_apiserver=directory / "kube-apiserver",
            kubectl=directory / "kubectl",
            version=version,
            standin_kubelet=directory / STANDIN_KUBELET,
        )

    def missing(self) -> list[Path]:
        """Binaries that are absent or not executable."""
        return [p for p in (self.etcd, self.kube_apiserver, self.kubectl) if not os.access(p, os.X_OK)]


def default_cache_dir(version: str | None = None) -> Path:
    """``~/.cache/kproxy/envtest/<version>``: one directory per pinned release, so bumping the pin rebuilds."""
    return CACHE_ROOT / (version or k8s_version())


def _build(out_dir: Path, out: IO[str], *, only: str | None = None) -> None:
    script = ENVTEST_TOOL_DIR / "build.sh"
    what = only or "etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, standin-kubelet, kwok"
    took = "a few minutes" if only else "15-30 minutes"
    print(f"kproxy envtest: building {what} into {out_dir} (a cold Go cache takes {took})...", file=out, flush=True)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", str(script), *(["--only", only] if only else []), str(out_dir)],
            cwd=ENVTEST_TOOL_DIR,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as e:
        raise EnvtestError(f"cannot run {script}: {e}") from e
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            out.write(line)
            out.flush()
    if proc.returncode != 0:
        raise EnvtestError(
            f"{script} {out_dir} failed with exit code {proc.returncode} (output above); "
            "it needs a Go toolchain on PATH, or set "
            f"{BIN_DIR_ENV} to a directory with prebuilt etcd, kube-apiserver and kubectl"
        )
    print(f"kproxy envtest: build finished in {time.monotonic() - started:.0f}s", file=out, flush=True)


def ensure_binaries(*, build: bool = True, out: IO[str] | None = None) -> BinPaths:
    """Return the control-plane binaries for the pinned release, building them if needed.

    ``$KPROXY_ENVTEST_BIN_DIR`` wins if set (and is never built into).  Otherwise
    the cache directory is complete when its VERSION file (written last by
    build.sh) matches the pin.  The build runs under an exclusive flock on
    ``<dir>.lock`` so concurrent test runs wait for one build instead of racing
    two on a small machine; the state is re-checked after taking the lock.
    """
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        bins = BinPaths.in_dir(Path(override))
        if missing := bins.missing():
            raise EnvtestError(f"${BIN_DIR_ENV}={override} lacks executables: {', '.join(map(str, missing))}")
        return bins

    version = k8s_version()
    directory = default_cache_dir(version)

    def ready() -> BinPaths | None:
        bins = BinPaths.in_dir(directory)
        return bins if bins.version == version and not bins.missing() else None

    if found := ready():
        return found
    if not build:
        raise EnvtestError(f"envtest binaries for {version} are not built in {directory}")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{directory}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found := ready():  # someone else built it while we waited
            return found
        _build(directory, out or sys.stderr)
    if found := ready():
        return found
    raise EnvtestError(f"build.sh succeeded but {directory} does not hold {version} binaries")


def ensure_extra(name: str, *, build: bool = True, out: IO[str] | None = None) -> Path:
    """One of :data:`EXTRA_BINARIES` for the pinned release, building just the missing ones if needed.

    Looked for in ``$KPROXY_ENVTEST_BIN_DIR`` if set (never built there unless that is the default cache
    directory, as ``make`` sets it), else in the default cache directory; the build takes the same lock as
    :func:`ensure_binaries`, so a cache made before a binary existed gets only what it lacks.
    """
    if name not in EXTRA_BINARIES:
        raise ValueError(f"{name} is not one of {EXTRA_BINARIES}")
    override = os.environ.get(BIN_DIR_ENV)
    directory = Path(override).absolute() if override else default_cache_dir()
    binary = directory / name

    def missing() -> list[str]:
        return [b for b in EXTRA_BINARIES if not os.access(directory / b, os.X_OK)]

    if os.access(binary, os.X_OK):
        return binary
    if not build or (override and directory != default_cache_dir().absolute()):
        raise EnvtestError(
            f"{binary} is missing: build it with `bash tools/envtest/build.sh --only {name} {directory}`"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{directory}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if todo := missing():
            _build(directory, out or sys.stderr, only=" ".join(todo))
    if not os.access(binary, os.X_OK):
        raise EnvtestError(f"build.sh succeeded but {binary} is not there")
    return binary


def ensure_standin_kubelet(*, build: bool = True, out: IO[str] | None = None) -> Path:
    """The ``standin-kubelet`` binary (see :func:`ensure_extra`)."""
    return ensure_extra(STANDIN_KUBELET, build=build, out=out)
