"""Run kproxy itself as a real `kproxy run` process, for tests and benchmarks."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kproxy.localcluster import certs
from kproxy.localcluster.processes import free_ports
from kproxy.testing.eventually import eventually


@dataclass
class RunningProxy:
    url: str
    admin_url: str
    kubeconfig: Path
    proc: subprocess.Popen[bytes]
    log: Path
    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    ca_file: Path | None = None
    config_path: Path | None = None

    def get(self, path: str, admin: bool = False, timeout: float = 10) -> tuple[int, bytes]:
        base = self.admin_url if admin else self.url
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file and not admin else None
            with urllib.request.urlopen(base + path, timeout=timeout, context=ctx) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def metrics(self) -> str:
        return self.get("/metrics", admin=True)[1].decode()

    def wait_cached(self, path: str, resource: str, timeout: float = 30) -> None:
        """Wait until kproxy answers a ``resourceVersion=0`` list of ``path`` from its cache of
        ``resource`` (its metrics' label: ``configmaps``, ``deployments.apps``): the cache is ready."""
        needle = f'kproxy_watchcache_reads_total{{reason="any",resource="{resource}",served="cache",verb="list"}}'

        def served() -> bool:
            self.get(f"{path}?resourceVersion=0")
            return needle in self.metrics()

        eventually(served, timeout, f"kproxy to serve {path} from its cache of {resource}", interval=0.2)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def write_config(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Rewrite the running proxy's config file with ``changes`` applied (top-level keys),
        replacing it atomically as a ConfigMap volume update does; returns the new config."""
        assert self.config_path is not None
        self.config = {**self.config, **changes}
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self.config))
        tmp.replace(self.config_path)
        return self.config


#: The Host names the tests' raw requests use (``Host: x``, tests/adversarial/wire.py's
#: ``kproxy.test``, absolute-form ``http://x/...`` and ``HTTP://X/...``) besides kubectl proxy's loopback names (the
#: default of ``proxy.accept_hosts``): test proxies in ``credentials: proxy`` accept them unless
#: started with ``test_hosts=False``.
TEST_HOSTS = ["^localhost$", r"^127\.0\.0\.1$", r"^\[::1\]$", "^[xX]$", r"^kproxy\.test$"]
#: ``extra={"proxy": ALLOW_EXEC}``: exec and attach through a ``credentials: proxy`` kproxy (its
#: default ``proxy.reject_paths`` refuses them, as kubectl proxy's does).
ALLOW_EXEC: dict[str, Any] = {"reject_paths": []}


def start_proxy(
    tmp: Path,
    upstream_kubeconfig: Path | None,
    *,
    credentials: str = "proxy",
    token: str | None = None,
    extra: dict[str, Any] | None = None,
    ready: bool = True,
    tls: bool = False,
    env: dict[str, str] | None = None,
    test_hosts: bool = True,
) -> RunningProxy:
    """Start `kproxy run` as its own process with a fresh config; wait until it listens.

    ``tls=True`` serves HTTPS with a certificate from a fresh CA (``tmp/proxy-ca.crt``): kubectl
    sends bearer tokens only over TLS, so `credentials: forward` is tested that way.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    port, admin = free_ports(2)
    cfg: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "credentials": credentials,
        "upstream": {"kubeconfig": str(upstream_kubeconfig) if upstream_kubeconfig else None},
        "log": {"level": "info", "format": "json"},
        "shutdown_timeout": "20s",
    }
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    if cfg.get("credentials") == "proxy" and test_hosts:
        cfg["proxy"] = {"accept_hosts": TEST_HOSTS, **(cfg.get("proxy") or {})}
    ca_path: Path | None = None
    if tls:
        ca = certs.generate_ca("kproxy-test-ca")
        leaf = certs.generate_serving_cert(ca, ("127.0.0.1", "localhost"), "kproxy")
        ca_path = certs.write_pem(tmp / "proxy-ca.crt", ca.cert_pem, private=False)
        cfg["tls"] = {
            "cert_file": str(certs.write_pem(tmp / "proxy.crt", leaf.cert_pem, private=False)),
            "key_file": str(certs.write_pem(tmp / "proxy.key", leaf.key_pem, private=True)),
            **(cfg.get("tls") or {}),  # e.g. client_ca_file from ``extra``
        }
    cfg_path = tmp / "kproxy.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    kubeconfig = tmp / "kproxy.kubeconfig"
    kc_cmd = [sys.executable, "-m", "kproxy.cli", "kubeconfig", "--config", str(cfg_path), "--output", str(kubeconfig)]
    if token:
        kc_cmd += [f"--token={token}"]  # a token may start with "-"
    if ca_path:
        kc_cmd += ["--certificate-authority", str(ca_path)]
    subprocess.run(kc_cmd, check=True, capture_output=True)
    log = tmp / "kproxy.log"
    env = {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    # A test run that dies before its fixtures' teardown must not leave kproxy running.
    atexit.register(_kill, proc)
    scheme = "https" if tls else "http"
    rp = RunningProxy(f"{scheme}://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", kubeconfig, proc, log, cfg, env)
    rp.ca_file = ca_path
    rp.config_path = cfg_path

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"kproxy exited with {proc.returncode}:\n{rp.log_text()}")
        return rp.get("/readyz", admin=True, timeout=2)[0] == 200 if ready else _connects(port)

    eventually(listening, 30, "kproxy to become ready")
    return rp


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False
