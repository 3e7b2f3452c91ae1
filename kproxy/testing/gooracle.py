"""Go's own answer to "how does Go read this?", for differential tests of ``kproxy.gocompat``.

``tools/gooracle`` is a tiny Go program (standard library only) that reads one JSON request per
line and answers with what Go's parser made of it. Tests feed it the hostile inputs they feed
kproxy's ports and compare: the port is right when it agrees with Go, input for input.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from kproxy.testing.binaries import REPO_ROOT
from kproxy.testing.gobuild import ensure_go_binary

__all__ = ["GoOracle", "b64"]

ORACLE_SOURCE = REPO_ROOT / "tools" / "gooracle"


def b64(value: str | None) -> bytes:
    """A Go ``[]byte`` field of the oracle's answer (JSON base64; ``null`` for an empty slice)."""
    return base64.b64decode(value) if value else b""


class GoOracle:
    """One running oracle process; :meth:`ask_many` sends a batch and reads the answers."""

    def __init__(self, binary: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [str(binary or ensure_go_binary(ORACLE_SOURCE, "gooracle"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def ask_many(self, kind: str, inputs: list[str]) -> list[dict[str, Any]]:
        """Go's answer for each input, in order. Inputs are ``str`` with ``surrogateescape`` for
        bytes that are not UTF-8; they reach Go as the original bytes."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        lines = []
        for text in inputs:
            raw = text.encode("utf-8", "surrogateescape")
            # JSON cannot carry bytes that are not UTF-8; such inputs go as Latin-1 and are
            # marked so the oracle restores the bytes.
            try:
                lines.append(json.dumps([kind, raw.decode("utf-8")]))
            except UnicodeDecodeError:
                lines.append(json.dumps([kind + "-latin1", raw.decode("latin-1")]))
        stdin = self.proc.stdin

        def write() -> None:  # from a thread: a big batch's answers fill the pipe before it is sent
            stdin.write(("\n".join(lines) + "\n").encode())
            stdin.flush()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        answers = [json.loads(self.proc.stdout.readline()) for _ in inputs]
        writer.join()
        return answers

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)
