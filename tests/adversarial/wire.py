"""Raw HTTP/1.1 over sockets: the request bytes go out exactly as written (Python's HTTP clients
normalise targets, methods and headers, which is what hostile input must not be), and the answer
is read with http.client's response parser (chunked, Content-Length or read-to-close)."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import ssl
import sys
from dataclasses import dataclass, field
from typing import Any

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

#: Statuses for exchanges that produced no HTTP answer.
TIMEOUT = 0
CLOSED = -1


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where raw bytes go: a host and port, TLS or not (with the client context to present)."""

    host: str
    port: int
    tls: ssl.SSLContext | None = None

    @classmethod
    def from_url(cls, url: str, tls: ssl.SSLContext | None = None) -> Endpoint:
        scheme, _, rest = url.partition("://")
        host, _, port = rest.rstrip("/").rpartition(":")
        if scheme == "https" and tls is None:
            raise ValueError(f"{url}: an https endpoint needs a client TLS context")
        return cls(host, int(port), tls if scheme == "https" else None)


@dataclass(slots=True)
class Answer:
    """One exchange's result; ``status`` is TIMEOUT or CLOSED when no HTTP answer came."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    error: str = ""

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def headers_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def decoded(self) -> bytes:
        """The body without its Content-Encoding (kproxy's compression filter answers in what was asked)."""
        coding = (self.header("Content-Encoding") or "").strip().lower()
        try:
            if coding == "gzip":
                return gzip.decompress(self.body)
            if coding == "zstd":
                return zstd.decompress(self.body)
        except Exception:
            return self.body
        return self.body

    def json(self) -> Any:
        try:
            return json.loads(self.decoded())
        except ValueError:
            return None

    def is_status(self) -> bool:
        """Whether the body is a Kubernetes Status (JSON, YAML or protobuf, as negotiated)."""
        doc = self.json()
        if isinstance(doc, dict):
            return doc.get("kind") == "Status"
        body = self.decoded()
        return b"kind: Status" in body or (body.startswith(b"k8s\x00") and b"\x12\x06Status" in body)

    def short(self) -> str:
        return f"{self.status} {self.error or self.body[:300]!r}"


def request_bytes(
    method: str,
    target: str,
    headers: list[tuple[str, str]] | None = None,
    body: bytes | None = None,
    *,
    host: str = "localhost",
) -> bytes:
    """A request head plus body, Content-Length computed unless a header says otherwise."""
    hdrs = list(headers or [])
    names = {k.lower() for k, _ in hdrs}
    if "host" not in names:
        hdrs.insert(0, ("Host", host))
    if body is not None and "content-length" not in names and "transfer-encoding" not in names:
        hdrs.append(("Content-Length", str(len(body))))
    if "connection" not in names:
        hdrs.append(("Connection", "close"))
    head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1")
    head += b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in hdrs)
    return head + b"\r\n" + (body or b"")


def _connect(ep: Endpoint, timeout: float) -> socket.socket:
    sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
    if ep.tls is not None:
        return ep.tls.wrap_socket(sock, server_hostname=ep.host)
    return sock


def exchange(ep: Endpoint, raw: bytes, *, timeout: float = 10.0) -> Answer:
    """Send ``raw`` on a fresh connection and read one answer (or say why there was none)."""
    method = raw.split(b" ", 1)[0].decode("latin-1")
    try:
        sock = _connect(ep, timeout)
    except OSError as e:
        return Answer(CLOSED, error=f"connect: {e}")
    try:
        with contextlib.suppress(OSError):  # the server may answer (and close) before reading it all
            sock.sendall(raw)
        resp = http.client.HTTPResponse(sock, method=method)
        try:
            resp.begin()
        except TimeoutError:
            return Answer(TIMEOUT, error="timeout")
        except http.client.RemoteDisconnected:
            return Answer(CLOSED, error="closed without an answer")
        except (http.client.HTTPException, OSError) as e:
            return Answer(CLOSED, error=f"{type(e).__name__}: {e}")
        answer = Answer(resp.status, list(resp.getheaders()))
        try:
            answer.body = b"" if resp.status == 101 else resp.read()
        except TimeoutError:
            answer.error = "timeout reading the body"
        except (http.client.HTTPException, OSError) as e:
            answer.error = f"body cut short: {type(e).__name__}: {e}"
        return answer
    finally:
        sock.close()
