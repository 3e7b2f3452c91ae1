"""A ``kproxy run`` config whose upstream refuses every connection: kproxy starts and listens
anyway, so what it does before and without the apiserver (its imports, loading a persisted
cache, its answers) can be measured and tested on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kproxy.localcluster.processes import free_ports


def unreachable_config(
    directory: Path, filters: list[dict[str, Any]], *, upstream_port: int | None = None, log_level: str = "warning"
) -> tuple[Path, int]:
    """Write ``directory/kproxy.yaml`` (plain HTTP on a free loopback port, ``credentials:
    proxy``, ``filters``) and its kubeconfig naming ``https://127.0.0.1:<upstream_port>``, where
    nothing listens (a free port when not given); return the config's path and the listen port."""
    upstream = upstream_port if upstream_port is not None else free_ports(1)[0]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{upstream}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    (directory / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    port, admin = free_ports(2)
    cfg = {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "credentials": "proxy",
        "upstream": {"kubeconfig": str(directory / "kubeconfig")},
        "log": {"level": log_level},
        "filters": filters,
    }
    path = directory / "kproxy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, port
