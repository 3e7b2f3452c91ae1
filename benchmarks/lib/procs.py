"""What processes cost, read from ``/proc``, and servers started in their own process group.

``cpu_seconds`` is the one CPU figure of the benchmarks: user + system time of every thread of a
process (fields 14 and 15 of ``/proc/PID/stat``), in seconds. A benchmark reads it at both edges
of its measured window and reports the difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.lib.common import BenchError, child_env

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_START_TIMEOUT = 60.0
_STOP_GRACE = 10.0


def cpu_seconds_or_none(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads) in seconds; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields are counted after the last ")".
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds; the process must be running."""
    cpu = cpu_seconds_or_none(pid)
    if cpu is None:
        raise BenchError(f"process {pid} is gone")
    return cpu


def cpu_seconds_or(pid: int | None, default: float) -> float:
    """``cpu_seconds``, or ``default`` for a process that is gone (or no process at all): one that
    may just have exited on its own at the window's end, or an optional one."""
    cpu = cpu_seconds_or_none(pid) if pid else None
    return default if cpu is None else cpu


def self_cpu_seconds() -> float:
    """utime + stime of this process (all its threads), at the clock's resolution rather than in
    ticks: the same figure as :func:`cpu_seconds` of this process's pid, fine enough to time one call."""
    return time.process_time()


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (all CPUs, anything but idle and iowait)."""
    with open("/proc/stat") as f:
        first = f.readline().split()
    # cpu user nice system idle iowait irq softirq steal (guest time is already in user and nice)
    ticks = [int(x) for x in first[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from ``/proc/<pid>/status`` (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for process {pid}")


async def settled_rss(pid: int, samples: int = 5, interval: float = 1.0) -> int:
    """The smallest of a few RSS samples: lets a Go process hand back memory it has freed."""
    values = []
    for i in range(samples):
        if i:
            await asyncio.sleep(interval)
        values.append(rss_bytes(pid))
    return min(values)


# --------------------------------------------------------------------------- servers


def http_status(port: int, path: str, timeout: float = 2.0) -> int | None:
    """Status of a plain-HTTP GET on loopback, None when nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Process:
    """A server a benchmark started, in its own process group; ``stop`` ends exactly that group."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, argv: Sequence[str], log: Path) -> Process:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=child_env(),
            )
        return cls(name, proc, log)

    def wait_ready(self, ready: Callable[[], bool], what: str, timeout: float = _START_TIMEOUT) -> None:
        """Return once ``ready()``; otherwise stop the process and raise with the tail of its log."""
        deadline = time.monotonic() + timeout
        try:
            while not ready():
                if self.proc.poll() is not None:
                    raise BenchError(
                        f"{self.name} exited with code {self.proc.returncode} before {what}; "
                        f"last lines of {self.log}:\n{tail(self.log)}"
                    )
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"{self.name} not ready after {timeout:.0f}s ({what}); "
                        f"last lines of {self.log}:\n{tail(self.log)}"
                    )
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(_STOP_GRACE)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Anything the server left behind in its own group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
