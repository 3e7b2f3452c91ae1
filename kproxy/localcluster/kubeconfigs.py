"""Self-contained kubeconfig files for the local control plane (or anything else with the same credentials)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from kproxy.localcluster import certs

__all__ = ["write_kubeconfig"]


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_file: Path | None,
    user: str,
    token: str | None = None,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    namespace: str = "default",
) -> Path:
    """Write a self-contained kubeconfig (certificates embedded as ``*-data``), mode 0600.

    Public so tests can point a kubeconfig at something else (e.g. a kproxy
    listener) with the same credentials.  Embedding keeps the file valid when
    copied elsewhere and avoids relative-path surprises.
    """

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cluster: dict[str, Any] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority-data"] = b64(ca_file)
    credentials: dict[str, Any] = {}
    if token is not None:
        credentials["token"] = token
    if client_cert is not None:
        credentials["client-certificate-data"] = b64(client_cert)
    if client_key is not None:
        credentials["client-key-data"] = b64(client_key)
    context = f"envtest-{user}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": cluster}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": context, "context": {"cluster": "envtest", "user": user, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }
    return certs.write_pem(path, yaml.safe_dump(config, sort_keys=False).encode(), private=True)
