"""The HTTP/2 settings kproxy's TLS listener serves with: those of Go's server in front of the
apiserver.

The apiserver configures its ``http2.Server`` in ``SecureServingInfo.Serve``
(staging/src/k8s.io/apiserver/pkg/server/secure_serving.go): the per-stream upload buffer and the
largest frame it reads are the 99th percentile of resource bodies (256 KiB), the connection's
upload buffer is that times the stream limit, and the stream limit is
``--http2-max-streams-per-connection`` (100 when unset on kube-apiserver). Go's server
(golang.org/x/net/http2 server.go) advertises those and a header list limit of
``MaxHeaderBytes`` (1 MiB) plus 32 bytes for each of ten headers, keeps a 4096-byte HPACK table,
and turns off RFC 7540 priorities. Read from a running kube-apiserver, its first SETTINGS frame
is ``MAX_FRAME_SIZE=262144 MAX_CONCURRENT_STREAMS=100 MAX_HEADER_LIST_SIZE=1048896
HEADER_TABLE_SIZE=4096 INITIAL_WINDOW_SIZE=262144 NO_RFC7540_PRIORITIES=1``, then a
WINDOW_UPDATE that opens the connection's window to 25 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The 99th percentile of resource bodies the apiserver sizes its buffers by (secure_serving.go).
RESOURCE_BODY_99TH_PERCENTILE = 256 * 1024
#: Go's server: ``MaxHeaderBytes`` (net/http's default, 1 MiB) plus 32 bytes of overhead for
#: each of ten headers (http2 server.go ``maxHeaderListSize``).
MAX_HEADER_LIST_SIZE = (1 << 20) + 32 * 10
#: HPACK's default table size, which Go's server keeps.
HEADER_TABLE_SIZE = 4096
#: RFC 9218's SETTINGS_NO_RFC7540_PRIORITIES, which Go's server sends as 1.
SETTINGS_NO_RFC7540_PRIORITIES = 0x9
#: Go's server closes a connection once this many control frames (SETTINGS and PING acks, RST_STREAMs)
#: wait to be written because its client does not read (http2 server.go ``maxQueuedControlFrames``).
MAX_QUEUED_CONTROL_FRAMES = 10000
#: After a graceful GOAWAY, Go's server closes the connection this long after its last stream ends
#: (http2 server.go ``goAwayTimeout``).
GOAWAY_TIMEOUT = 1.0
#: Handlers Go's server queues beyond the stream limit, as a multiple of it, before it decides
#: the client is resetting streams to run more handlers than it may (CVE-2023-44487): then it
#: sends GOAWAY ENHANCE_YOUR_CALM (http2 server.go ``scheduleHandler``).
UNSTARTED_HANDLERS_FACTOR = 4


@dataclass(frozen=True, slots=True)
class H2Limits:
    """One listener's HTTP/2 settings (``http2`` in the config; the rest as the apiserver's)."""

    max_concurrent_streams: int = 100
    stream_window: int = RESOURCE_BODY_99TH_PERCENTILE
    max_frame_size: int = RESOURCE_BODY_99TH_PERCENTILE
    max_header_list_size: int = MAX_HEADER_LIST_SIZE
    idle_timeout: float = 90.0

    @property
    def connection_window(self) -> int:
        """The connection's receive window: every stream's at once (secure_serving.go)."""
        return self.stream_window * self.max_concurrent_streams
