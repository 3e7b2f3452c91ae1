"""Errors, logging, work directories and the context lines every report starts with."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from kproxy.localcluster import envtest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Environment variables that could route a child's traffic elsewhere; loopback benchmarks never want them.
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


class BenchError(RuntimeError):
    """The benchmark could not be set up or run; the message says what failed."""


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    """This process's environment without proxy variables, for the processes a benchmark starts."""
    env = dict(os.environ)
    for name in _PROXY_ENV:
        env.pop(name, None)
        env.pop(name.lower(), None)
    return env


@contextlib.contextmanager
def work_dir(prefix: str = "kproxy-bench-") -> Iterator[Path]:
    """Configs and logs of the proxies: removed after a clean run, kept (and named) otherwise."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    ok = False
    try:
        yield directory
        ok = True
    finally:
        if ok:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            log(f"proxy configs and logs kept for inspection in {directory}")


# --------------------------------------------------------------------------- the machine


def ncpu() -> int:
    return len(os.sched_getaffinity(0))


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def k8s_server_version(info: envtest.ControlPlaneInfo) -> str:
    try:
        status, body = info.request("GET", "/version")
        if status == 200:
            return str(json.loads(body).get("gitVersion", "?"))
    except (OSError, ValueError, http.client.HTTPException):
        pass
    return info.version or "?"


def machine_line(load_before: tuple[float, float, float] | None = None) -> str:
    """``- machine: ...`` for a report: CPUs, model, kernel and the load average before the run."""
    line = f"- machine: {ncpu()} CPUs ({cpu_model()}), Linux {platform.release()}"
    if load_before is not None:
        line += f", load average before the run {' / '.join(f'{x:.2f}' for x in load_before)}"
    return line


def software_line(k8s: str) -> str:
    """``- software: ...`` for a report: Python, aiohttp, kproxy and Kubernetes versions."""
    from kproxy import __version__ as kproxy_version

    return (
        f"- software: Python {platform.python_version()}, aiohttp {aiohttp.__version__}, "
        f"kproxy {kproxy_version}, Kubernetes {k8s} (kube-apiserver, etcd and kubectl from envtest)"
    )
