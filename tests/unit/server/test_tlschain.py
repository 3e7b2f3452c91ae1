"""kproxy's upstream TLS presents the client certificate chain the kubeconfig gives, as client-go.

A local TLS 1.3 server that requires a client certificate records the client's Certificate
handshake message (``SSLContext._msg_callback`` sees it decrypted) and counts what was sent.
OpenSSL's default, shown by the plain ``ssl`` context below, appends the trust store's CA to a
leaf-only client certificate; the kube-apiserver then verifies the leaf's signature twice on every
request (see ``kproxy/server/tlschain.py`` for the measurement).
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.tlschain import SSL_MODE_NO_AUTO_CHAIN, send_configured_chain_only, ssl_ctx_mode

_HANDSHAKE, _CERTIFICATE = 22, 11


@pytest.fixture(scope="module")
def pki() -> dict[str, certs.CertKey]:
    ca = certs.generate_ca()
    return {
        "ca": ca,
        "serving": certs.generate_serving_cert(ca, ["127.0.0.1"]),
        "client": certs.generate_client_cert(ca, "me", ["system:masters"]),
    }


def _count_certificates(message: bytes) -> int:
    """Certificates in a TLS 1.3 Certificate handshake message (RFC 8446, 4.4.2)."""
    body = message[4:]  # msg_type(1) length(3)
    ctx_len = body[0]
    pos = 1 + ctx_len
    end = pos + 3 + int.from_bytes(body[pos : pos + 3], "big")
    pos += 3
    n = 0
    while pos < end:
        cert_len = int.from_bytes(body[pos : pos + 3], "big")
        pos += 3 + cert_len
        ext_len = int.from_bytes(body[pos : pos + 2], "big")
        pos += 2 + ext_len
        n += 1
    return n


async def _certificates_sent(client_ctx: ssl.SSLContext, pki: dict[str, certs.CertKey], tmp: Path) -> int:
    """Connect with ``client_ctx`` to a server requiring a client certificate; how many it got."""
    (tmp / "srv.crt").write_bytes(pki["serving"].cert_pem)
    (tmp / "srv.key").write_bytes(pki["serving"].key_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=pki["ca"].cert_pem.decode())
    server_ctx.load_cert_chain(tmp / "srv.crt", tmp / "srv.key")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    sent: list[int] = []

    def on_message(_conn: Any, direction: str, _v: Any, content_type: Any, msg_type: Any, data: bytes) -> None:
        if direction == "read" and content_type == _HANDSHAKE and msg_type == _CERTIFICATE:
            sent.append(_count_certificates(data))

    server_ctx._msg_callback = on_message  # type: ignore[attr-defined]
    peer: list[object] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer.append(writer.get_extra_info("peercert"))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1")
        assert await reader.read() == b"ok"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert peer and peer[0], "the server verified a client certificate"
    assert len(sent) == 1
    return sent[0]


def _kubeconfig(tmp: Path, pki: dict[str, certs.CertKey], client_cert_pem: bytes) -> Path:
    (tmp / "ca.crt").write_bytes(pki["ca"].cert_pem)
    (tmp / "c.crt").write_bytes(client_cert_pem)
    (tmp / "c.key").write_bytes(pki["client"].key_pem)
    return write_kubeconfig(
        tmp / "kc",
        server="https://127.0.0.1:1",
        ca_file=tmp / "ca.crt",
        user="me",
        client_cert=tmp / "c.crt",
        client_key=tmp / "c.key",
    )


async def test_openssl_alone_appends_the_ca_to_a_leaf_only_certificate(
    pki: dict[str, certs.CertKey], tmp_path: Path
) -> None:
    (tmp_path / "c.crt").write_bytes(pki["client"].cert_pem)
    (tmp_path / "c.key").write_bytes(pki["client"].key_pem)
    plain = ssl.create_default_context(cadata=pki["ca"].cert_pem.decode())
    plain.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    assert await _certificates_sent(plain, pki, tmp_path) == 2


async def test_kproxy_sends_the_leaf_the_kubeconfig_gives_and_nothing_more(
    pki: dict[str, certs.CertKey], tmp_path: Path
) -> None:
    ctx = from_kubeconfig(str(_kubeconfig(tmp_path, pki, pki["client"].cert_pem))).ssl_context(True)
    assert ctx is not None
    assert ssl_ctx_mode(ctx) & SSL_MODE_NO_AUTO_CHAIN
    assert await _certificates_sent(ctx, pki, tmp_path) == 1


async def test_a_chain_the_kubeconfig_gives_is_sent_whole(pki: dict[str, certs.CertKey], tmp_path: Path) -> None:
    chain = pki["client"].cert_pem + pki["ca"].cert_pem
    ctx = from_kubeconfig(str(_kubeconfig(tmp_path, pki, chain))).ssl_context(True)
    assert ctx is not None
    assert await _certificates_sent(ctx, pki, tmp_path) == 2


def test_the_kubeconfig_ca_is_the_only_one_trusted(pki: dict[str, certs.CertKey], tmp_path: Path) -> None:
    """client-go trusts only certificate-authority(-data) when given; the system's roots otherwise."""
    target = from_kubeconfig(str(_kubeconfig(tmp_path, pki, pki["client"].cert_pem)))
    for with_cert in (True, False):
        ctx = target.ssl_context(with_cert)
        assert ctx is not None
        assert ctx.cert_store_stats()["x509_ca"] == 1
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_mode_is_set_on_the_context_it_is_given() -> None:
    a, b = ssl.create_default_context(), ssl.create_default_context()
    before = ssl_ctx_mode(b)
    assert send_configured_chain_only(a)
    assert ssl_ctx_mode(a) & SSL_MODE_NO_AUTO_CHAIN
    assert ssl_ctx_mode(b) == before and not before & SSL_MODE_NO_AUTO_CHAIN
