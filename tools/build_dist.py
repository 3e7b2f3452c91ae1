"""Build kproxy's sdist, then its wheel from that sdist, as ``python -m build`` does.

Why not ``python -m build`` itself: it would add a dependency and, isolated, download the build backend on
every run. This calls the PEP 517 hooks of the backend already installed next to it (the same setuptools
that requirements.lock pins for the image), so ``make dist`` and the release test build offline and fast.

The source tree is first copied to a scratch directory (without VCS, venv and cache directories): setuptools
writes ``*.egg-info`` and ``build/`` into the tree it builds, and the checkout is shared. Building the wheel
from the unpacked sdist, not from the checkout, proves the sdist alone is enough to build kproxy.

    python tools/build_dist.py OUTDIR        # prints the sdist's and the wheel's paths
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Not part of any source distribution: VCS, virtualenvs, caches, earlier build output.
SKIP = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc")


def _hook(source: Path, hook: str, outdir: Path) -> Path:
    """Run one PEP 517 hook of pyproject.toml's backend in a fresh interpreter, in ``source``."""
    code = f"import setuptools.build_meta as b; print(b.{hook}({str(outdir)!r}))"
    name = subprocess.run(
        [sys.executable, "-c", code], cwd=source, check=True, capture_output=True, text=True
    ).stdout.splitlines()[-1]
    return outdir / name


def build(outdir: Path) -> tuple[Path, Path]:
    """Write ``kproxy-<version>.tar.gz`` and ``kproxy-<version>-py3-none-any.whl`` into ``outdir``."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kproxy-dist-") as scratch:
        source = Path(scratch) / "source"
        shutil.copytree(REPO, source, ignore=SKIP)
        sdist = _hook(source, "build_sdist", outdir)
        with tarfile.open(sdist) as tar:
            tar.extractall(Path(scratch) / "unpacked", filter="data")
        (unpacked,) = (Path(scratch) / "unpacked").iterdir()
        wheel = _hook(unpacked, "build_wheel", outdir)
    return sdist, wheel


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for path in build(Path(sys.argv[1]).resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
