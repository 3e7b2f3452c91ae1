"""HTTP/2's own attack classes, sent to Go's server in front of the real kube-apiserver and to kproxy's
TLS listener in front of it, with the same bytes (tests/e2e/h2attack.py writes the frames).

Each test runs once per target. Against ``apiserver`` it records what Go's HTTP/2 server does
(golang.org/x/net/http2/server.go and frame.go, as vendored by the apiserver): the GOAWAY or
RST_STREAM code, whether and when it closes the connection. Against ``kproxy`` the same assertions
hold, and the verdict on the process: its RSS growth and CPU time during the attack (from
/proc/PID/status and /proc/PID/stat), and another client's requests answered meanwhile in bounded
time. Every attack is small (seconds, megabytes) and aimed at 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from h2attack import (
    CODES,
    MAX_STREAM_ID,
    SMALL,
    H2Wire,
    _hpack_int,
    _send_block,
    concurrent_streams,
    continuation_flood,
    control_flood,
    flow_control_overrun,
    hpack_bomb,
    oversized_headers,
    ping,
    rapid_reset,
    stream_id_exhaustion,
)

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import process_cpu_seconds
from kproxy.testing.proxyproc import start_proxy

pytestmark = pytest.mark.timeout(120)

#: Bounds on the process during one attack (each sends at most a few megabytes for a few seconds).
RSS_GROWTH_MIB = 64
CPU_SECONDS = 6.0
#: Another client's request during an attack is answered within this time.
PROBE_SECONDS = 3.0


@dataclass
class Target:
    name: str
    port: int
    pid: int
    token: str

    def wire(self, **kw: object) -> H2Wire:
        w = H2Wire("127.0.0.1", self.port, **kw)  # type: ignore[arg-type]
        w.handshake()
        return w

    def probe(self) -> tuple[int, float]:
        """Another client's small request over its own HTTP/1.1 connection: (status, seconds)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        start = time.monotonic()
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=ctx)
        try:
            conn.request("GET", SMALL, headers={"Authorization": f"Bearer {self.token}"})
            resp = conn.getresponse()
            resp.read()
            return resp.status, time.monotonic() - start
        except (OSError, http.client.HTTPException):
            return 0, time.monotonic() - start
        finally:
            conn.close()


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@dataclass
class Verdict:
    """The target process's cost and another client's answers while an attack runs."""

    target: Target
    rss_before: float = 0.0
    rss_after: float = 0.0
    cpu: float = 0.0
    probes: list[tuple[int, float]] = field(default_factory=list)

    def check(self, rss_growth_mib: float | None = RSS_GROWTH_MIB, cpu_seconds: float = CPU_SECONDS) -> None:
        t = self.target
        assert Path(f"/proc/{t.pid}").exists(), f"{t.name} died during the attack"
        assert self.probes, "no request of another client completed during the attack"
        bad = [p for p in self.probes if p[0] != 200 or p[1] > PROBE_SECONDS]
        assert not bad, f"another client's requests to {t.name} during the attack: {bad} (of {len(self.probes)})"
        if rss_growth_mib is not None:
            assert self.rss_after - self.rss_before <= rss_growth_mib, f"{t.name}: {self}"
        assert self.cpu <= cpu_seconds, f"{t.name}: {self}"

    def __str__(self) -> str:
        worst = max((p[1] for p in self.probes), default=0.0)
        return (
            f"RSS {self.rss_before:.0f} -> {self.rss_after:.0f} MiB, CPU {self.cpu:.2f} s, "
            f"{len(self.probes)} probes (slowest {worst:.3f} s)"
        )


Measure = Callable[[], contextlib.AbstractContextManager[Verdict]]


@pytest.fixture
def verdict(target: Target) -> Measure:
    """``with verdict() as v:`` around an attack measures the target and probes it from another client."""

    @contextlib.contextmanager
    def measure() -> Iterator[Verdict]:
        v = Verdict(target, rss_before=_rss_mib(target.pid))
        cpu0 = process_cpu_seconds(target.pid) or 0.0
        stop = threading.Event()

        def probing() -> None:
            while not stop.is_set():
                v.probes.append(target.probe())

        th = threading.Thread(target=probing, daemon=True)
        th.start()
        try:
            yield v
        finally:
            # At least one probe after the attack, whatever its length.
            done = len(v.probes)
            deadline = time.monotonic() + 15
            while len(v.probes) <= done and th.is_alive() and time.monotonic() < deadline:
                th.join(0.05)
            stop.set()
            th.join(15)
            v.cpu = (process_cpu_seconds(target.pid) or 0.0) - cpu0
            v.rss_after = _rss_mib(target.pid)
            print(f"\n{target.name}: {v}")

    return measure


@pytest.fixture(scope="module")
def kproxy_target(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """kproxy's TLS listener, forwarding callers' tokens to the apiserver."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-h2-attacks"), control_plane.admin_kubeconfig, credentials="forward", tls=True
    )
    try:
        yield Target("kproxy", int(rp.url.rsplit(":", 1)[1]), rp.proc.pid, control_plane.admin_token)
    finally:
        rp.stop()


@pytest.fixture(scope="module", params=["apiserver", "kproxy"])
def target(request: pytest.FixtureRequest, control_plane: ControlPlaneInfo) -> Target:
    """Go's server (the apiserver itself) or kproxy in front of it: each attack runs against both."""
    if request.param == "kproxy":
        kp: Target = request.getfixturevalue("kproxy_target")
        return kp
    assert control_plane.apiserver_pid
    return Target("apiserver", control_plane.apiserver_port, control_plane.apiserver_pid, control_plane.admin_token)


# ------------------------------------------------------------------------------------------- settings


def test_settings_as_the_apiserver(control_plane: ControlPlaneInfo, kproxy_target: Target) -> None:
    """The SETTINGS and connection window each side announces first. The apiserver's (its
    pkg/server/secure_serving.go on golang.org/x/net/http2/server.go): max concurrent streams 100,
    initial window and max frame size 256 KiB, max header list size 1 MiB + 320, a connection
    window of 100 x 256 KiB; kproxy must announce the same."""
    with H2Wire("127.0.0.1", control_plane.apiserver_port) as go, kproxy_target.wire() as w:
        go.handshake()
        go.until(lambda g: any("WindowUpdate" in t for t in g.trace), 2)
        w.until(lambda g: any("WindowUpdate" in t for t in g.trace), 2)
        assert go.got.settings[0x3] == 100  # the apiserver's --http2-max-streams-per-connection default
        keys = (0x1, 0x3, 0x4, 0x5, 0x6)  # header table, max streams, initial window, max frame, max header list
        assert {k: w.got.settings.get(k) for k in keys} == {k: go.got.settings.get(k) for k in keys}
        conn_window = [t for t in go.got.trace if "WindowUpdateFrame(stream_id=0" in t]
        assert [t.split(" ", 1)[1] for t in w.got.trace if "WindowUpdateFrame(stream_id=0" in t][:1] == [
            t.split(" ", 1)[1] for t in conn_window
        ][:1]


# ------------------------------------------------------------------------------------------- streams


def test_rapid_reset(target: Target, verdict: Measure) -> None:
    """CVE-2023-44487: 2,000 watches opened and reset at once on one connection. Go runs at most
    MaxConcurrentStreams handlers and queues the rest; more than 4 x that queued ends the
    connection with GOAWAY ENHANCE_YOUR_CALM (scheduleHandler in golang.org/x/net/http2/server.go)
    — on two shared vCPUs about one run in three; otherwise the handlers keep up and the connection
    answers the PING sent after the last reset. The apiserver may also end it gracefully (GOAWAY
    NO_ERROR) when one of the cancelled requests fails its authentication."""
    with verdict() as v, target.wire() as w:
        rapid_reset(w, target.token, streams=2000)
        got = w.got
        assert got.closed or got.ping_acks, f"{target.name} neither answered nor closed: {got.summary()}"
        assert got.goaway_code in (None, CODES["ENHANCE_YOUR_CALM"], CODES["NO_ERROR"]), got.summary()
        print(f"{target.name}: {got.summary()}")
    v.check()


def test_streams_over_the_limit(target: Target, verdict: Measure) -> None:
    """101 watches at once: the 101st gets RST_STREAM PROTOCOL_ERROR once the client has
    acknowledged the limit (over_max_streams in golang.org/x/net/http2/server.go), the first 100
    are answered, and the connection stays."""
    with verdict() as v, target.wire() as w:
        concurrent_streams(w, target.token, 101)
        got = w.got
        assert got.rst == {201: CODES["PROTOCOL_ERROR"]}, got.summary()
        assert w.until(lambda g: len(g.headers) == 100, 10), got.summary()
        assert {got.status(s) for s in got.headers} == {"200"}
        assert got.goaway_code is None and ping(w)
    v.check()


def test_stream_id_exhaustion(target: Target, verdict: Measure) -> None:
    """A request on the last stream id (2^31-1) is answered; one on a lower id after it is a
    connection error: GOAWAY PROTOCOL_ERROR naming 2^31-1 as the last stream, then the close
    (processHeaders' stream_went_down in golang.org/x/net/http2/server.go; the close after its goAwayTimeout, 1 s)."""
    with verdict() as v, target.wire() as w:
        stream_id_exhaustion(w, target.token)
        got = w.got
        assert got.status(MAX_STREAM_ID) == "200", got.summary()
        assert got.goaway_code == CODES["PROTOCOL_ERROR"] and got.goaway_last_stream == MAX_STREAM_ID, got.summary()
        assert w.until_closed(5), got.summary()
    v.check()


# ------------------------------------------------------------------------------------------- headers


def test_continuation_flood(target: Target, verdict: Measure) -> None:
    """CVE-2023-45288: HEADERS then CONTINUATION frames of 16 KB each that never end the block.
    Go stops once the block's bytes pass twice what is left of its max header list size
    (readMetaFrame in golang.org/x/net/http2/frame.go): GOAWAY PROTOCOL_ERROR and the close,
    after a few megabytes at most."""
    with verdict() as v, target.wire() as w:
        sent = continuation_flood(w, target.token, seconds=4)
        got = w.got
        print(f"{target.name}: {sent / 2**20:.1f} MiB of header block sent; {got.summary()}")
        assert got.goaway_code == CODES["PROTOCOL_ERROR"] and got.closed, got.summary()
        assert sent < 32 * 2**20
    v.check()


def test_continuation_flood_of_empty_frames(target: Target, verdict: Measure) -> None:
    """Zero-length CONTINUATION frames without END_HEADERS for three seconds: they add no header
    bytes, so Go keeps reading them (readMetaFrame counts bytes, not frames). Neither side may
    grow or spin on them; closing the connection (GOAWAY PROTOCOL_ERROR or ENHANCE_YOUR_CALM) is
    allowed."""
    with verdict() as v, target.wire() as w:
        continuation_flood(w, target.token, seconds=3, empty=True)
        got = w.got
        print(f"{target.name}: {got.summary()}")
        assert got.goaway_code in (None, CODES["PROTOCOL_ERROR"], CODES["ENHANCE_YOUR_CALM"]), got.summary()
    v.check()


def test_hpack_bomb(target: Target, verdict: Measure) -> None:
    """A 4,000-byte header put in the HPACK dynamic table and referenced 10,000 times: a 10 KB
    block that decodes to 40 MB. Go stops emitting fields past its max header list size and
    answers the stream 431 (handleHeaderListTooLong in golang.org/x/net/http2/server.go); the
    connection stays usable."""
    with verdict() as v, target.wire() as w:
        hpack_bomb(w, target.token, refs=10_000)
        got = w.got
        assert got.status(1) == "431", got.summary()
        assert got.goaway_code is None and ping(w), got.summary()
    v.check()


def test_header_blocks_of_many_literal_fields(target: Target, verdict: Measure) -> None:
    """Header blocks of 12,000 short literal fields (an indexed name, a 60-byte value, not
    indexed) in three frames of the 256 KiB frame size: 750 KB that decode to more than the
    max header list size, so Go truncates the list and answers each stream 431, and the
    connection goes on (readMetaFrame in golang.org/x/net/http2/frame.go). Decoding costs Go
    little; hpack's decoder copied the rest of the block for each literal field (quadratic: about
    a second of kproxy's event loop per block), so a few blocks a second stalled every client."""
    field = _hpack_int(58, 4) + _hpack_int(60, 7) + b"v" * 60  # user-agent, literal without indexing
    with verdict() as v, target.wire() as w:
        for sid in range(1, 12, 2):
            head = w.block(w.request_headers(SMALL, token=target.token))
            _send_block(w, sid, head + field * 12_000, fragment=256 * 1024)
            w.until(lambda g, s=sid: g.closed or s in g.ended or s in g.rst, 10)
            assert w.got.status(sid) == "431", w.got.summary()
        assert w.got.goaway_code is None and ping(w), w.got.summary()
    v.check(cpu_seconds=2.0)


def test_oversized_header_list(target: Target, verdict: Measure) -> None:
    """1.2 MB of real header fields (over the 1 MiB + 320 max header list size) in HEADERS and
    CONTINUATION frames of 16 KiB: once past the limit, the next fragment is a connection error
    (readMetaFrame in golang.org/x/net/http2/frame.go): GOAWAY PROTOCOL_ERROR and the close."""
    with verdict() as v, target.wire() as w:
        oversized_headers(w, target.token, total=1_200_000)
        got = w.got
        assert got.goaway_code == CODES["PROTOCOL_ERROR"], got.summary()
        assert w.until_closed(5), got.summary()
    v.check()


# ------------------------------------------------------------------------------------ control frames


def test_ping_flood(target: Target, verdict: Measure) -> None:
    """PING frames sent as fast as the socket takes them by a client that reads none of the ACKs:
    once more than 10,000 control frames wait to be written, Go closes the connection without a
    GOAWAY (maxQueuedControlFrames in golang.org/x/net/http2/server.go), well within a second."""
    with verdict() as v, target.wire(recv_buffer=4096) as w:
        sent = control_flood(w, "ping", frames=400_000, timeout=6)
        print(f"{target.name}: {sent} PINGs sent; {w.got.summary()}")
        assert w.got.closed, f"{target.name} kept a connection that reads no ACKs: {w.got.summary()}"
    v.check()


def test_settings_flood(target: Target, verdict: Measure) -> None:
    """100,000 empty SETTINGS frames (each asks for an ACK) from a client that reads none: Go
    processes them one by one (each ACK counts as a queued control frame, the same 10,000 bound
    as PINGs); in these few seconds its socket buffers still take the ACKs and it keeps the
    connection. Either way the cost stays bounded."""
    with verdict() as v, target.wire(recv_buffer=4096) as w:
        sent = control_flood(w, "settings", frames=100_000, timeout=5)
        print(f"{target.name}: {sent} SETTINGS sent; {w.got.summary()}")
        assert w.got.goaway_code in (None, CODES["ENHANCE_YOUR_CALM"], CODES["PROTOCOL_ERROR"]), w.got.summary()
    v.check(cpu_seconds=10.0)


# -------------------------------------------------------------------------------------- flow control


def test_data_past_the_window(target: Target, verdict: Measure) -> None:
    """A POST body 16 KiB past the stream window the server announced, written at once: Go resets
    the stream FLOW_CONTROL_ERROR (processData's data_flow in golang.org/x/net/http2/server.go)
    and keeps the connection; nothing is created."""
    with verdict() as v, target.wire() as w:
        flow_control_overrun(w, target.token, "/api/v1/namespaces/default/configmaps")
        got = w.got
        assert got.rst == {1: CODES["FLOW_CONTROL_ERROR"]}, got.summary()
        assert got.goaway_code is None and ping(w), got.summary()
    v.check()


def test_slow_reader_on_a_watch(
    control_plane: ControlPlaneInfo, namespace: str, target: Target, verdict: Measure
) -> None:
    """A watch whose reader never opens its stream window while 28 MB of events are written to it.
    Go sends no more than the window (64 KiB), keeps the stream open with the rest held back
    (the writer waits on flow control), and the same connection's other streams and PINGs are
    still answered. kproxy may end the stream (a slow watcher), but must not buffer the events:
    its RSS stays bounded. The apiserver's own RSS grows with the objects in its watch cache
    whatever the reader does, so only kproxy's is bounded."""
    objects, size = 32, 900_000
    try:
        _slow_reader(control_plane, namespace, target, verdict, objects, size)
    finally:
        # 28 MB of ConfigMaps left in the session's cluster would slow every later test that lists
        # or caches ConfigMaps (the session has no namespace controller to clean them up).
        control_plane.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps")


def _slow_reader(
    control_plane: ControlPlaneInfo, namespace: str, target: Target, verdict: Measure, objects: int, size: int
) -> None:
    with verdict() as v, target.wire() as w:
        w.window_update(0, 1 << 30)  # the connection's window is open; only the watch's stays shut
        w.request(1, f"/api/v1/namespaces/{namespace}/configmaps?watch=1", token=target.token)
        assert w.until(lambda g: g.status(1) is not None or g.closed, 10), w.got.summary()
        assert w.got.status(1) == "200", w.got.summary()
        for i in range(objects):
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"big-{i}"},
                "data": {"x": "y" * size},
            }
            code, resp = control_plane.request(
                "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(body).encode()
            )
            assert code == 201, resp[:300]
        # The watch got at most its window, while another stream on the connection is answered.
        w.request(3, SMALL, token=target.token)
        assert w.until(lambda g: 3 in g.ended or g.closed, 10), w.got.summary()
        got = w.got
        assert got.status(3) == "200" and got.data.get(1, 0) <= 65_535, got.summary()
        assert ping(w), got.summary()
        print(f"{target.name}: watch got {got.data.get(1, 0)} bytes; stream 1 reset: {got.rst.get(1)}; {got.summary()}")
        assert got.goaway_code is None, got.summary()
    v.check(rss_growth_mib=None if target.name == "apiserver" else 16)
