"""The local control plane and the peers measured against it: the apiserver itself, kproxy,
kubectl proxy; kproxy's Prometheus metrics."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.lib.common import BenchError, log
from benchmarks.lib.load import TLSFiles
from benchmarks.lib.procs import Process, http_status
from kproxy.localcluster import envtest
from kproxy.localcluster.processes import free_ports

DIRECT, KPROXY, KUBECTL = "direct", "kproxy", "kubectl proxy"

#: a metric sample: (name, labels, value)
Sample = tuple[str, dict[str, str], float]


@contextlib.contextmanager
def control_plane(envtest_dir: Path | None) -> Iterator[envtest.ControlPlaneInfo]:
    """A running control plane: the one in ``envtest_dir``, or a fresh one stopped on exit."""
    if envtest_dir is not None:
        st = envtest.status(envtest_dir)
        if not st.up:
            raise BenchError(f"no ready control plane in {envtest_dir}: {st.summary()}")
        yield envtest.load(envtest_dir)
        return
    bins = envtest.ensure_binaries()
    directory = Path(tempfile.mkdtemp(prefix="kproxy-bench-envtest-"))
    ok = False
    try:
        log(f"starting a control plane in {directory} ...")
        yield envtest.up(directory, bins=bins)
        ok = True
    finally:
        envtest.down(directory)
        if ok:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            log(f"control-plane files kept for inspection in {directory}")


# --------------------------------------------------------------------------- peers


@dataclass(frozen=True)
class Peer:
    name: str
    base_url: str
    tls: TLSFiles | None = None
    #: the proxy process, whose CPU time is reported (None for the apiserver itself)
    pid: int | None = None
    #: kproxy's admin listener (``http://127.0.0.1:PORT``), empty for other peers
    admin_url: str = ""


def kproxy_argv() -> list[str]:
    script = Path(sys.executable).parent / "kproxy"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kproxy.cli"]


def start_kproxy(
    work: Path, info: envtest.ControlPlaneInfo, filters: Sequence[dict[str, Any]] = ()
) -> tuple[Process, Peer]:
    """``kproxy run`` (proxy credentials, plain HTTP) with ``filters``; an empty chain by default."""
    port, admin = free_ports(2)
    config = {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "credentials": "proxy",
        "upstream": {"kubeconfig": str(info.admin_kubeconfig)},
        "log": {"level": "warning", "access_log": False},
        "filters": list(filters),
    }
    cfg = work / "kproxy.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = Process.start(KPROXY, [*kproxy_argv(), "run", "--config", str(cfg)], work / "kproxy.log")
    proc.wait_ready(lambda: http_status(admin, "/readyz") == 200, "GET /readyz on its admin listener said 200")
    return proc, Peer(KPROXY, f"http://127.0.0.1:{port}", pid=proc.proc.pid, admin_url=f"http://127.0.0.1:{admin}")


def admin_url(work: Path) -> str:
    """The admin listener of the kproxy :func:`start_kproxy` configured in ``work``."""
    cfg = yaml.safe_load((work / "kproxy.yaml").read_text())
    return f"http://{cfg['admin_listen']}"


def start_kubectl_proxy(work: Path, info: envtest.ControlPlaneInfo) -> tuple[Process, Peer]:
    (port,) = free_ports(1)
    argv = [
        str(info.kubectl),
        f"--kubeconfig={info.admin_kubeconfig}",
        f"--cache-dir={work / 'kubectl-cache'}",
        "proxy",
        "--address=127.0.0.1",
        f"--port={port}",
        # Without this kubectl proxy rejects some paths and non-localhost Host headers.
        "--disable-filter=true",
    ]
    proc = Process.start(KUBECTL, argv, work / "kubectl-proxy.log")
    proc.wait_ready(lambda: http_status(port, "/version") == 200, "GET /version said 200")
    return proc, Peer(KUBECTL, f"http://127.0.0.1:{port}", pid=proc.proc.pid)


# --------------------------------------------------------------------------- kproxy metrics


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition."""
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


async def metric_samples(session: aiohttp.ClientSession, admin_url: str) -> list[Sample]:
    async with session.get(admin_url + "/metrics") as r:
        return parse_metrics(await r.text())


async def metric_sum(
    session: aiohttp.ClientSession, admin_url: str, name: str, match: Callable[[dict[str, str]], bool]
) -> float:
    return sum(v for n, labels, v in await metric_samples(session, admin_url) if n == name and match(labels))
