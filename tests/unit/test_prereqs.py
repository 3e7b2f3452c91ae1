"""make's prerequisite check: each missing piece is one line with its fix (tools/check-prereqs.sh)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "check-prereqs.sh"


def check(what: str, path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), what],
        capture_output=True,
        text=True,
        env={"PATH": f"{path}:/usr/bin:/bin", **(env or {})},
    )


def fake(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    exe = directory / name
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)


def test_this_machine_has_what_make_needs() -> None:
    for what in ("python", "go"):
        out = subprocess.run(["bash", str(SCRIPT), what], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_old_go_is_named_with_the_fix(tmp_path: Path) -> None:
    fake(tmp_path, "go", "echo go1.20.3")
    out = check("go", tmp_path)
    assert out.returncode == 1
    assert "needs Go 1.26.0 or newer; go on PATH is 1.20.3: install a newer Go" in out.stderr
    assert out.stderr.count("\n") == 1


def test_missing_go_names_the_way_out(tmp_path: Path) -> None:
    out = check("go", tmp_path / "empty")
    assert out.returncode == 1
    assert "go is not on PATH" in out.stderr and "KPROXY_ENVTEST_BIN_DIR" in out.stderr


def test_old_python_is_named_with_the_fix(tmp_path: Path) -> None:
    fake(tmp_path, "python3", 'case "$1" in -V) echo "Python 3.9.2";; *) exit 1;; esac')
    out = check("python", tmp_path, {"PYTHON": str(tmp_path / "python3")})
    assert out.returncode == 1
    assert "needs Python 3.11 or newer" in out.stderr and "is Python 3.9.2" in out.stderr
    assert "make PYTHON=" in out.stderr
