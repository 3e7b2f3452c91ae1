"""The client-go informer test program (``tests/e2e/informer``): building it and driving it.

A real controller's view of kproxy needs real client-go, so the e2e tests run a small Go program built
from its own Go module (client-go pinned to the control plane's release).  The binary is cached under
``~/.cache/kproxy/informer/<hash of go.mod, go.sum, main.go>/`` so only a change to the program rebuilds
it; the build uses the same Go settings as the control plane's (``tools/envtest/build.sh``: the Go module
proxy, no cgo).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kproxy.localcluster.binaries import REPO_ROOT
from kproxy.testing.gobuild import ensure_go_binary

__all__ = ["INFORMER_SOURCE", "Informer", "ensure_informer"]

INFORMER_SOURCE = REPO_ROOT / "tests" / "e2e" / "informer"


def ensure_informer(source: Path = INFORMER_SOURCE) -> Path:
    """The informer binary for the current sources, built once and reused after."""
    return ensure_go_binary(source, "informer")


class Informer:
    """A running informer process; its JSON lines are collected by a reader thread as they come."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        namespace: str = "",
        env: dict[str, str] | None = None,
        event_retry_sleep: float | None = None,
        resource: str = "",
        metadata: bool = False,
    ) -> None:
        args = [str(ensure_informer()), "-kubeconfig", str(kubeconfig)]
        if namespace:
            args += ["-namespace", namespace]
        if resource:  # GROUP/VERSION/RESOURCE through the dynamic client (default: pods)
            args += ["-resource", resource]
        if metadata:  # with resource: its metadata alone, through the metadata client
            args += ["-metadata"]
        if event_retry_sleep is not None:  # client-go's default: 10 s between an event's tries
            args += ["-event-retry-sleep", f"{event_retry_sleep}s"]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[dict[str, Any]] = []
        self._stores: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self.stderr = b""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = json.loads(raw)
            with self._lock:
                self.lines.append(line)
            if line.get("kind") == "store":
                self._stores.put(line)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()  # klog's output: only for failure messages

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The lines of one kind seen so far (``event``, ``list``, ``watch``, ``watch-error``, ...)."""
        with self._lock:
            return [line for line in self.lines if line.get("kind") == kind]

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if self.proc.poll() is not None:
                raise AssertionError(f"the informer exited ({self.proc.returncode}) while waiting for {what}")
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout}s waiting for the informer: {what}")
            time.sleep(0.05)

    def _command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def record_event(self, reason: str) -> None:
        """Record an event with client-go's event recorder (on a pod reference in the informer's
        namespace); its writes show up as ``event-write`` lines."""
        assert reason and " " not in reason and "\n" not in reason, reason
        self._command(f"event {reason}")

    def store(self, timeout: float = 10) -> dict[str, str]:
        """The informer's whole store, ``namespace/name -> resourceVersion``."""
        self._command("dump")
        try:
            line = self._stores.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the informer did not dump its store") from None
        objects: dict[str, str] = line["objects"]
        return objects

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
