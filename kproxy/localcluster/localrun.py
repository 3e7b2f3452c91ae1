"""``kproxy envtest run``: the living local cluster in the foreground, as ``make run`` starts it.

It starts a fresh control plane with the components through a kproxy running the given config,
prints the walk-through (:mod:`kproxy.localcluster.walkthrough`), and stays until Ctrl-C (or SIGTERM, SIGHUP, or
kproxy or the apiserver dying), then stops everything it started and says so.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import yaml

from kproxy.localcluster import walkthrough
from kproxy.localcluster.cluster import start_components
from kproxy.localcluster.errors import EnvtestError
from kproxy.localcluster.lifecycle import down, status, up
from kproxy.localcluster.state import _read_state

__all__ = ["run_foreground"]

_CHECK_INTERVAL = 2.0


def _dead(directory: Path) -> str | None:
    """The first process of the living cluster that is gone, if any."""
    state = _read_state(directory)
    if state is None:
        return "the control plane's state"
    for name, proc in (("kube-apiserver", state.apiserver), ("etcd", state.etcd), *state.extras.items()):
        if proc is None or not proc.alive():
            return name
    return None


def run_foreground(directory: Path, config: Path, *, nodes: int = 3, timeout: float = 120.0) -> int:
    """Run the living cluster until interrupted; returns the exit code (0 after Ctrl-C)."""
    if status(directory).has_state and (status(directory).etcd_alive or status(directory).apiserver_alive):
        print(
            f"kproxy envtest run: a cluster is already running in {directory}; stop it with `make stop` "
            f"(or `kproxy envtest down --dir {directory}`)",
            file=sys.stderr,
        )
        return 1
    try:
        cfg = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        print(f"kproxy envtest run: cannot read {config}: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    started = time.monotonic()
    try:
        info = up(directory, timeout=timeout)
        start_components(
            info,
            mode="proxied",
            proxy=cfg,
            nodes=nodes,
            admin_listen=str(cfg.get("admin_listen", "127.0.0.1:9099")),
            timeout=timeout,
        )
        walkthrough.prepare(info)
        print(f"living cluster up in {time.monotonic() - started:.1f}s\n", flush=True)
        print(walkthrough.render(info, config=str(config), nodes=nodes), flush=True)
        print("\nCtrl-C here stops kproxy and the cluster.", flush=True)
        gone = None
        while not stop.wait(_CHECK_INTERVAL):
            if gone := _dead(directory):
                print(f"\nkproxy envtest run: {gone} exited; see the logs in {directory}", file=sys.stderr)
                break
        return 1 if gone else 0
    except EnvtestError as e:
        print(f"kproxy envtest run: {e}", file=sys.stderr)
        return 1
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if down(directory):
            print(f"\nstopped kproxy, the controllers, kwok, kube-apiserver and etcd ({directory})", flush=True)
