"""Opening the listeners: binding a port (an error naming the config key), the TLS context and
the address actually bound."""

from __future__ import annotations

import os
import ssl
from typing import Any

from aiohttp import web

from kproxy.config import Config, ConfigError, ListenAddr

__all__ = ["bind", "bound_address", "format_address", "server_ssl"]


def bound_address(site: web.BaseSite) -> tuple[str, int]:
    server: Any = site._server  # aiohttp keeps the asyncio server here
    sock = server.sockets[0]
    host, port = sock.getsockname()[:2]
    return host, port


def format_address(addr: tuple[str, int] | None) -> str:
    if addr is None:
        return ""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reason(err: BaseException) -> str:
    """An OS or TLS error's reason without Python's decoration (``[Errno 98] ...``)."""
    if isinstance(err, OSError) and err.errno:
        return os.strerror(err.errno).lower()  # "address already in use", "permission denied"
    return str(err)


async def bind(site: web.TCPSite, key: str, addr: ListenAddr) -> None:
    """Start a listener; a port in use (or not ours to take) is a one-line start-up error naming the key."""
    try:
        await site.start()
    except OSError as err:
        host = f"[{addr.host}]" if ":" in addr.host else addr.host
        raise ConfigError(f"{key}: cannot listen on {host}:{addr.port}: {_reason(err)}") from None


def server_ssl(cfg: Config, *, http2: bool) -> ssl.SSLContext | None:
    """The listener's TLS context (None without ``tls``); with ``http2``, ALPN offers ``h2`` then
    ``http/1.1``, the apiserver's order (a client that offers neither is served HTTP/1.1)."""
    if cfg.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cfg.tls.cert_file, cfg.tls.key_file)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"tls: cannot load {cfg.tls.cert_file} and its key: {_reason(err)}") from None
    if cfg.tls.client_ca_file:
        # A certificate is optional, but one that does not verify fails the handshake. The
        # apiserver asks with tls.RequestClientCert and verifies afterwards, so there such a
        # caller is a 401 without a token (or authenticated by its token); Python's ssl has
        # no way to take a certificate it does not verify (README.md#limits).
        ctx.load_verify_locations(cfg.tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return ctx
