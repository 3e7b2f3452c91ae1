"""Where the upstream is and how to authenticate to it: kubeconfig files or the pod's service account.

Supports what kubectl users put in kubeconfigs: CA file/data, client cert/key file/data, bearer
token and token file, exec credential plugins (client.authentication.k8s.io ExecCredential),
``tls-server-name``, and ``insecure-skip-tls-verify`` (honoured only when the kubeconfig says
so). Relative paths are resolved against the kubeconfig's own directory, as clientcmd does.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kproxy.config import ConfigError
from kproxy.core.status import internal_error
from kproxy.server.tlschain import send_configured_chain_only

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class TokenSource:
    """Supplies a bearer token per request (static, file-backed or exec plugin)."""

    async def token(self) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(slots=True)
class StaticToken(TokenSource):
    value: str

    async def token(self) -> str | None:
        return self.value


@dataclass(slots=True)
class FileToken(TokenSource):
    """A token file re-read when it changes (projected service-account tokens rotate).

    The file is stat'ed at most once per ``recheck`` seconds, so the hot path costs a clock read.
    """

    path: str
    recheck: float = 5.0
    _value: str | None = None
    _stamp: tuple[int, int] = (-1, -1)
    _checked: float = 0.0

    async def token(self) -> str | None:
        now = time.monotonic()
        if self._value is None or now - self._checked >= self.recheck:
            self._checked = now
            try:
                # The kubelet rotates by swapping in a new file: the inode changes even where
                # timestamps are coarse.
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_mtime_ns)
                if stamp != self._stamp or self._value is None:
                    self._value = Path(self.path).read_text().strip()
                    self._stamp = stamp
            except OSError:
                if self._value is None:
                    raise
        return self._value


@dataclass(slots=True)
class ExecToken(TokenSource):
    """client.authentication.k8s.io exec plugin: run the command, cache until expiry."""

    command: str
    args: list[str]
    env: dict[str, str]
    api_version: str
    install_hint: str = ""
    _value: str | None = None
    _expires: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def token(self) -> str | None:
        async with self._lock:
            if self._value is not None and (self._expires == 0.0 or time.time() < self._expires - 10):
                return self._value
            try:
                cred = await run_exec_plugin(self.command, self.args, self.env, self.api_version, self.install_hint)
            except ConfigError as err:
                # The caller asked nothing wrong: kproxy could not get its own credentials.
                raise internal_error(f"kproxy's upstream credentials: {err}") from None
            status = cred.get("status") or {}
            self._value = status.get("token")
            self._expires = _parse_expiry(status.get("expirationTimestamp"))
            return self._value


def _parse_expiry(value: str | None) -> float:
    if not value:
        return 0.0
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def exec_not_found(command: str, install_hint: str) -> ConfigError:
    """client-go's words for a credential plugin that is not installed (plugin/pkg/client/auth/exec,
    ``wrapCmdRunErrorLocked``), with the kubeconfig's ``installHint``."""
    msg = f"exec: executable {command} not found (a client-go credential plugin the kubeconfig names is not installed)"
    return ConfigError(msg + (f": {' '.join(install_hint.split())}" if install_hint else ""))


def check_exec_plugin(command: str, install_hint: str, env_path: str | None = None) -> None:
    """At start-up: the plugin must be found as the kubeconfig names it (a path, or a name on $PATH)."""
    if shutil.which(command, path=env_path) is None:
        raise exec_not_found(command, install_hint)


async def run_exec_plugin(
    command: str, args: list[str], env: Mapping[str, str], api_version: str, install_hint: str = ""
) -> Any:
    """Run an exec credential plugin the way client-go does and return its ExecCredential."""
    info = {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    proc_env = {**os.environ, **env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
    try:
        proc = await asyncio.create_subprocess_exec(
            command,
            *args,
            env=proc_env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        raise exec_not_found(command, install_hint) from None
    out, err = await proc.communicate()
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip()
        raise ConfigError(
            f"exec: executable {command} failed with exit code {proc.returncode}" + (f": {detail}" if detail else "")
        )
    try:
        return json.loads(out)
    except ValueError as e:
        raise ConfigError(f"exec plugin {command} printed no ExecCredential JSON: {e}") from None


@dataclass(slots=True)
class UpstreamTarget:
    """The resolved upstream: its URL, TLS settings and (the proxy's own) credentials."""

    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    token: TokenSource | None = None
    source: str = ""

    @property
    def is_tls(self) -> bool:
        return self.server.startswith("https://")

    def ssl_context(self, with_client_cert: bool = True) -> ssl.SSLContext | None:
        """TLS for upstream connections. ``with_client_cert=False`` for forwarded callers, who
        must never borrow the proxy's certificate."""
        if not self.is_tls:
            return None
        # As client-go: a kubeconfig's CA is the only one trusted; the system's roots only
        # when it names none. PROTOCOL_TLS_CLIENT verifies the certificate and the host name.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_pem:
            ctx.load_verify_locations(cadata=self.ca_pem.decode())
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if with_client_cert and self.client_cert_pem and self.client_key_pem:
            _load_cert_chain(ctx, self.client_cert_pem, self.client_key_pem)
            send_configured_chain_only(ctx)
        return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl can only load a key pair from files: write them to a private temp dir, load, remove.
    with tempfile.TemporaryDirectory(prefix="kproxy-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        ctx.load_cert_chain(str(cert_path), str(key_path))


def _read(base: Path, data: str | None, file: str | None, what: str) -> bytes | None:
    if data:
        try:
            return base64.b64decode(data)
        except ValueError:
            raise ConfigError(f"kubeconfig: {what}-data is not valid base64") from None
    if file:
        path = Path(os.path.expanduser(file))
        if not path.is_absolute():
            path = base / path
        try:
            return path.read_bytes()
        except OSError as e:
            raise ConfigError(f"kubeconfig: cannot read {what} {path}: {e.strerror}") from None
    return None


def _merge_kubeconfigs(paths: list[Path]) -> tuple[dict[str, Any], dict[str, Path]]:
    """Merge like clientcmd: the first file to define a name wins; current-context from the first
    file that sets one. Returns the merged config and, per entry, the file it came from."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    origin: dict[str, Path] = {}
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise ConfigError(f"kubeconfig {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"kubeconfig {path}: not valid YAML: {e}") from None
        if not merged["current-context"]:
            merged["current-context"] = doc.get("current-context") or ""
        for kind, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for item in doc.get(kind) or []:
                name = item.get("name")
                if name is not None and name not in merged[kind]:
                    merged[kind][name] = item.get(key) or {}
                    origin[f"{kind}/{name}"] = path.parent
    return merged, origin


def from_kubeconfig(paths: str | list[str], context: str | None = None) -> UpstreamTarget:
    """Resolve the upstream from kubeconfig file(s) and an optional context name."""
    if isinstance(paths, str):
        paths = [p for p in paths.split(os.pathsep) if p]
    files = [Path(os.path.expanduser(p)) for p in paths]
    merged, origin = _merge_kubeconfigs(files)
    ctx_name = context or merged["current-context"]
    if not ctx_name:
        raise ConfigError(f"kubeconfig {os.pathsep.join(paths)}: no current-context and no --context given")
    ctx = merged["contexts"].get(ctx_name)
    if ctx is None:
        raise ConfigError(f"kubeconfig: context {ctx_name!r} not found")
    cluster_name, user_name = ctx.get("cluster", ""), ctx.get("user", "")
    cluster = merged["clusters"].get(cluster_name)
    if cluster is None:
        raise ConfigError(f"kubeconfig: cluster {cluster_name!r} (context {ctx_name!r}) not found")
    user = merged["users"].get(user_name, {}) if user_name else {}
    cbase = origin.get(f"clusters/{cluster_name}", Path.cwd())
    ubase = origin.get(f"users/{user_name}", Path.cwd())
    server = str(cluster.get("server", "")).rstrip("/")
    if not server:
        raise ConfigError(f"kubeconfig: cluster {cluster_name!r} has no server")
    ca = "certificate-authority"
    target = UpstreamTarget(
        server=server,
        ca_pem=_read(cbase, cluster.get(f"{ca}-data"), cluster.get(ca), ca),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=cluster.get("tls-server-name"),
        client_cert_pem=_read(
            ubase, user.get("client-certificate-data"), user.get("client-certificate"), "client-certificate"
        ),
        client_key_pem=_read(ubase, user.get("client-key-data"), user.get("client-key"), "client-key"),
        source=f"kubeconfig context {ctx_name}",
    )
    if user.get("token"):
        target.token = StaticToken(str(user["token"]))
    elif user.get("tokenFile"):
        path = Path(os.path.expanduser(user["tokenFile"]))
        target.token = FileToken(str(path if path.is_absolute() else ubase / path))
    elif user.get("exec"):
        ex = user["exec"]
        env = {e["name"]: e["value"] for e in ex.get("env") or []}
        target.token = ExecToken(
            command=ex["command"],
            args=list(ex.get("args") or []),
            env=env,
            api_version=ex.get("apiVersion", "client.authentication.k8s.io/v1"),
            install_hint=str(ex.get("installHint") or ""),
        )
        check_exec_plugin(ex["command"], str(ex.get("installHint") or ""), env.get("PATH"))
    elif user.get("username") and user.get("password"):
        raise ConfigError("kubeconfig: basic auth (username/password) is not supported by the apiserver any more")
    return target


def in_cluster(sa_dir: str | None = None, env: Mapping[str, str] | None = None) -> UpstreamTarget:
    """The pod's service account: KUBERNETES_SERVICE_HOST/PORT, mounted CA and rotating token."""
    env = os.environ if env is None else env
    sa = Path(sa_dir or env.get("KPROXY_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR)
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token = sa / "token"
    if not token.exists():
        raise ConfigError(f"in-cluster: no service-account token at {token}")
    if ":" in host:
        host = f"[{host}]"
    try:
        ca = (sa / "ca.crt").read_bytes()
    except OSError as e:
        raise ConfigError(f"in-cluster: cannot read {sa / 'ca.crt'}: {e.strerror}") from None
    return UpstreamTarget(
        server=f"https://{host}:{port}",
        ca_pem=ca,
        token=FileToken(str(token)),
        source="in-cluster service account",
    )


def resolve_upstream(kubeconfig: str | None, context: str | None) -> UpstreamTarget:
    """clientcmd's precedence: explicit kubeconfig, then $KUBECONFIG, then the in-cluster service
    account, then ~/.kube/config."""
    if kubeconfig:
        return from_kubeconfig(kubeconfig, context)
    if os.environ.get("KUBECONFIG"):
        return from_kubeconfig(os.environ["KUBECONFIG"], context)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    default = Path.home() / ".kube" / "config"
    if default.exists():
        return from_kubeconfig(str(default), context)
    raise ConfigError("no upstream: give --kubeconfig (or upstream.kubeconfig), set KUBECONFIG, or run in a pod")
