"""The control-plane processes: spawn detached, check liveness (pid + start time), terminate; ports and logs.

Processes are started in their own sessions so they outlive the Python process
that ran ``up`` (the CLI returns while the control plane keeps running);
``down`` reads state.json and signals the process groups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from kproxy.localcluster.errors import ControlPlaneError

_LOG_TAIL_LINES = 60
_POLL_INTERVAL = 0.1

# Popen objects of processes this interpreter started, so they can be reaped
# (a dead-but-unreaped child is a zombie that still answers kill(pid, 0)).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _proc_stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the ``(comm)`` field: [0] is field 3 (state), [19] field 22 (starttime); [] if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads) in seconds, or None when it is gone."""
    fields = _proc_stat_fields(pid)
    # fields[11] and fields[12] are fields 14 and 15 of /proc/PID/stat.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK if fields else None


def _proc_start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (from /proc); with the pid it identifies a process across pid reuse."""
    fields = _proc_stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


def _proc_state(pid: int) -> str | None:
    fields = _proc_stat_fields(pid)
    return fields[0] if fields else None


def _alive(pid: int | None, start_time: str | None) -> bool:
    """Whether ``pid`` is still the process we started (running, not a zombie, not a reused pid)."""
    if pid is None:
        return False
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists but belongs to someone else: the start-time check decides
    if _proc_state(pid) in ("Z", "X"):
        # The thread-group leader of a killed Go program turns zombie while its other threads are
        # still exiting and holding its sockets; it is gone only when no other task remains.
        try:
            return any(int(t) != pid for t in os.listdir(f"/proc/{pid}/task"))
        except (OSError, ValueError):
            return False
    if start_time is not None:
        current = _proc_start_time(pid)
        if current is not None and current != start_time:
            return False
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the process group ``pid`` leads (all we start are session leaders), else just ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_dead(pid: int, start_time: str | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid, start_time):
        child = _CHILDREN.get(pid)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=min(remaining, 0.5))
        else:
            time.sleep(min(remaining, _POLL_INTERVAL))
    return True


def _terminate(pid: int | None, start_time: str | None, *, kill: bool = False, grace: float = 10.0) -> None:
    """SIGTERM (or SIGKILL right away) the process group, escalating to SIGKILL after ``grace`` seconds."""
    if pid is None or not _alive(pid, start_time):
        _CHILDREN.pop(pid or -1, None)
        return
    _signal_group(pid, signal.SIGKILL if kill else signal.SIGTERM)
    if not _wait_dead(pid, start_time, 0.0 if kill else grace):
        _signal_group(pid, signal.SIGKILL)
        if not _wait_dead(pid, start_time, 10.0):
            raise ControlPlaneError(f"process {pid} survived SIGKILL")
    # Stragglers in the group (the group id stays reserved while any member lives, so this is safe).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    _CHILDREN.pop(pid, None)


def _spawn(argv: Sequence[str], log: Path, cwd: Path) -> tuple[int, str | None]:
    """Start ``argv`` detached (own session, output appended to ``log``); return pid and start time."""
    with open(log, "ab") as f:
        f.write(f"\n=== kproxy envtest {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n".encode())
        f.flush()
        try:
            child = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise ControlPlaneError(f"cannot start {argv[0]}: {e}") from e
    _CHILDREN[child.pid] = child
    return child.pid, _proc_start_time(child.pid)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together so they differ; racy by nature, see lifecycle.up())."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _port_clash_since(log: Path, offset: int) -> bool:
    """Whether the process logging to ``log`` after byte ``offset`` failed to bind its port."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return b"address already in use" in f.read()
    except OSError:
        return False


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.splitlines()[-lines:])
