"""A process's TCP connections, read from /proc (tests and benchmarks count what a process holds)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def tcp_connections(pid: int, local_port: int = 0, remote_port: int = 0) -> tuple[int, int]:
    """Established TCP connections of process ``pid``: (accepted on ``local_port``, made to
    ``remote_port``), its socket inodes matched against the kernel's TCP tables."""
    inodes = _socket_inodes(pid)
    accepted = outgoing = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] != "01" or cols[9] not in inodes:  # 01: ESTABLISHED
                    continue
                local, remote = int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)
                accepted += local == local_port
                outgoing += remote == remote_port
    return accepted, outgoing


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections process ``pid`` made to ``port``."""
    return tcp_connections(pid, remote_port=port)[1]
