"""An emulated WAN link: toxiproxy (``tools/toxiproxy``) between a client and the apiserver.

toxiproxy is a TCP proxy with an HTTP API that adds "toxics" to each direction of a link:
``latency`` (each chunk held back by a fixed delay, pipelined: a 1,024-chunk buffer) and
``bandwidth`` (each chunk held back by its length over a rate). Both are added to both directions,
bandwidth first, so a link is "serialised at ``rate``, then ``one_way_ms`` in flight" each way.

It is built from its Go module by ``make toxiproxy-bin`` into
``~/.cache/kproxy/toxiproxy/<version>/`` (override the directory with ``KPROXY_TOXIPROXY_BIN_DIR``);
:func:`ensure_toxiproxy` builds it there when missing. Only for benchmarks and tests: the server's
API and its proxies listen on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kproxy.localcluster.binaries import CACHE_ROOT, REPO_ROOT
from kproxy.localcluster.errors import EnvtestError
from kproxy.localcluster.processes import free_ports

__all__ = ["Link", "Toxiproxy", "ensure_toxiproxy", "toxiproxy_version"]

TOOL_DIR = REPO_ROOT / "tools" / "toxiproxy"
BIN_DIR_ENV = "KPROXY_TOXIPROXY_BIN_DIR"


def toxiproxy_version() -> str:
    """The ``github.com/Shopify/toxiproxy/v2`` version pinned in ``tools/toxiproxy/go.mod``."""
    found = re.search(
        r"^\s*(?:require\s+)?github\.com/Shopify/toxiproxy/v2\s+(v\S+)", (TOOL_DIR / "go.mod").read_text(), re.M
    )
    if not found:
        raise EnvtestError("no github.com/Shopify/toxiproxy/v2 pin in tools/toxiproxy/go.mod")
    return found.group(1)


def ensure_toxiproxy() -> Path:
    """The directory holding ``toxiproxy-server`` and ``toxiproxy-cli`` of the pinned version (built
    once with ``tools/toxiproxy/build.sh``, as ``make toxiproxy-bin`` does)."""
    if os.environ.get(BIN_DIR_ENV):
        directory = Path(os.environ[BIN_DIR_ENV])
    else:
        directory = CACHE_ROOT.parent / "toxiproxy" / toxiproxy_version()
    if os.access(directory / "toxiproxy-server", os.X_OK):
        return directory
    done = subprocess.run(
        ["bash", str(TOOL_DIR / "build.sh"), str(directory)], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise EnvtestError(f"building toxiproxy failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return directory


@dataclass(frozen=True, slots=True)
class Link:
    """A WAN profile: ``rtt_ms`` round trip (half of it added each way) and ``mbit`` per second
    each way (None: no cap)."""

    name: str
    rtt_ms: int
    mbit: float | None

    @property
    def rate_kb(self) -> int:
        """toxiproxy's bandwidth unit: bytes per millisecond (KB/s of 1,000 bytes)."""
        assert self.mbit is not None
        return round(self.mbit * 1_000_000 / 8 / 1000)


class Toxiproxy:
    """A running ``toxiproxy-server`` on 127.0.0.1, driven through its HTTP API."""

    def __init__(self, log: Path | None = None) -> None:
        directory = ensure_toxiproxy()
        (self.port,) = free_ports(1)
        self.api = f"http://127.0.0.1:{self.port}"
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the process keeps it
        argv = [str(directory / "toxiproxy-server"), "-host", "127.0.0.1", "-port", str(self.port)]
        self.proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                self._call("GET", "/proxies")
                break
            except (urllib.error.URLError, OSError, ValueError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise EnvtestError("toxiproxy-server did not start") from None
                time.sleep(0.05)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.api + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
        return json.loads(raw) if raw.strip() else None

    def proxy(self, name: str, upstream: str) -> str:
        """A new proxy to ``upstream`` (``host:port``) on a free loopback port; its ``host:port``."""
        (port,) = free_ports(1)
        listen = f"127.0.0.1:{port}"
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        return listen

    def kubeconfig_through(
        self, name: str, kubeconfig: Path, apiserver_port: int, link: Link | None, dst: Path
    ) -> Path:
        """``kubeconfig`` with its server replaced by a new proxy ``name`` to the apiserver on
        ``apiserver_port``, shaped as ``link``; written (0600) to ``dst``."""
        listen = self.proxy(name, f"127.0.0.1:{apiserver_port}")
        self.shape(name, link)
        return rewrite_kubeconfig(kubeconfig, dst, f"https://{listen}")

    def shape(self, name: str, link: Link | None) -> None:
        """Replace the toxics of proxy ``name`` with ``link`` (None: a plain TCP relay). Applies to
        connections opened afterwards and, in toxiproxy, to open ones too."""
        for toxic in self._call("GET", f"/proxies/{name}/toxics") or []:
            self._call("DELETE", f"/proxies/{name}/toxics/{toxic['name']}")
        if link is None:
            return
        for stream in ("upstream", "downstream"):
            if link.mbit is not None:
                self._call(
                    "POST",
                    f"/proxies/{name}/toxics",
                    {
                        "name": f"bw-{stream}",
                        "type": "bandwidth",
                        "stream": stream,
                        "attributes": {"rate": link.rate_kb},
                    },
                )
            self._call(
                "POST",
                f"/proxies/{name}/toxics",
                {
                    "name": f"lat-{stream}",
                    "type": "latency",
                    "stream": stream,
                    "attributes": {"latency": link.rtt_ms // 2, "jitter": 0},
                },
            )

    def relayed_bytes(self) -> int:
        """Bytes the server has written so far: what it relayed, both ways, on every proxy (and
        its API's small answers). toxiproxy's own counters (``-proxy-metrics``) count a
        connection's bytes only once it closes, and kept-alive connections do not; the kernel's
        count of the process's writes (``/proc/PID/io``, ``wchar``) is current."""
        for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
        raise EnvtestError("no wchar in /proc/PID/io")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def rewrite_kubeconfig(src: Path, dst: Path, server: str) -> Path:
    """A copy of kubeconfig ``src`` at ``dst`` (0600) whose clusters' server is ``server``."""
    kc = yaml.safe_load(src.read_text())
    for cluster in kc["clusters"]:
        cluster["cluster"]["server"] = server
    dst.write_text(yaml.safe_dump(kc))
    dst.chmod(0o600)
    return dst
