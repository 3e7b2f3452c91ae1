"""What the container image carries: `kproxy run` and the dependencies it imports, and nothing else.

The Dockerfile installs the kproxy package from its build context, which .dockerignore filters: the
test doubles (kproxy.testing) and the local cluster (kproxy.localcluster, ``kproxy envtest``) stay
out. No container engine runs here, so these tests build that context's package tree the way Docker
filters it and run `kproxy run` from it (until it listens), and `kproxy envtest` (which answers that
the local cluster is not installed, without a traceback). Runtime dependencies: each one in
pyproject.toml is imported by a module the image carries, and those modules import nothing else
outside the standard library.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kproxy.testing.unreachable import unreachable_config

REPO = Path(__file__).resolve().parents[2]
LEFT_OUT = ("kproxy.testing", "kproxy.localcluster")


def _dockerignore_rules() -> list[tuple[bool, str]]:
    """(excluded, pattern) in file order; the last rule that matches a path decides (Docker's semantics)."""
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        excluded = not line.startswith("!")
        rules.append((excluded, line.removeprefix("!").rstrip("/")))
    return rules


def _ignored(rel: str, rules: list[tuple[bool, str]]) -> bool:
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]  # a directory's rule covers its files
    verdict = False
    for excluded, pattern in rules:
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts)
        else:
            hit = any(fnmatch.fnmatchcase(p, pattern) for p in prefixes)
        if hit:
            verdict = excluded
    return verdict


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kproxy package as the image's build context holds it (what `pip install .` installs there)."""
    rules = _dockerignore_rules()
    root = tmp_path_factory.mktemp("image") / "site"
    for path in sorted((REPO / "kproxy").rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if path.is_file() and not _ignored(rel, rules):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, root / rel)
    return root


def _modules(tree: Path) -> dict[str, Path]:
    return {".".join(p.relative_to(tree).with_suffix("").parts): p for p in (tree / "kproxy").rglob("*.py")}


def test_the_image_carries_neither_the_test_doubles_nor_the_local_cluster(image_tree: Path) -> None:
    names = set(_modules(image_tree))
    assert {"kproxy.cli", "kproxy.server.proxy", "kproxy.cacher.persist"} <= names
    assert sorted(n for n in names if n.startswith(LEFT_OUT)) == []
    # while the checkout (and the wheel: filter authors' tests, `kproxy envtest`) has both
    assert (REPO / "kproxy" / "testing" / "exchange.py").exists()
    assert (REPO / "kproxy" / "localcluster" / "envtest.py").exists()


def _env(tree: Path) -> dict[str, str]:
    """The image's tree first on the path, ahead of the checkout's kproxy (installed in development mode)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_") and k != "KUBECONFIG"}
    return {**env, "PYTHONPATH": str(tree)}


# The checkout's kproxy is installed in development mode: setuptools' finder would find the modules
# the image's tree lacks in the checkout. Without it, only what the image carries is found.
ONLY_THE_IMAGE_TREE = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]"
)


# `kproxy run` until both listeners are bound; then the loaded modules and where kproxy came from.
PROBE = textwrap.dedent(
    """
    import json, os, signal, sys
    ONLY_THE_IMAGE_TREE
    import kproxy
    from kproxy.cli import main
    import kproxy.server.proxy as proxy

    started = proxy.ProxyServer.start

    async def start(self):
        await started(self)
        with open(os.environ["PROBE_OUT"], "w") as out:
            json.dump({"file": kproxy.__file__, "modules": sorted(sys.modules)}, out)
        os.kill(os.getpid(), signal.SIGTERM)

    proxy.ProxyServer.start = start
    sys.exit(main(sys.argv[1:]))
    """
).replace("ONLY_THE_IMAGE_TREE", ONLY_THE_IMAGE_TREE)


def test_kproxy_run_starts_from_what_the_image_carries(image_tree: Path, tmp_path: Path) -> None:
    filters = [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(tmp_path / "s")}}]
    unreachable_config(tmp_path, filters)  # kproxy listens anyway
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "run", "--config", str(tmp_path / "kproxy.yaml")],
        cwd=tmp_path,  # not the checkout: its kproxy must not be found first
        env={**_env(image_tree), "PROBE_OUT": str(out)},
        capture_output=True,
        timeout=120,
    )
    assert out.exists(), f"kproxy did not listen (exit {proc.returncode}): {proc.stderr.decode()[-2000:]}"
    assert proc.returncode in (0, -signal.SIGTERM), proc.stderr.decode()[-2000:]
    probe = json.loads(out.read_text())
    assert Path(probe["file"]).is_relative_to(image_tree)
    assert "kproxy.filters.watchcache" in probe["modules"]


RUN_MAIN = "from kproxy.cli import main; sys.exit(main(sys.argv[1:]))"


def test_kproxy_envtest_in_the_image_says_what_is_missing(image_tree: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", f"{ONLY_THE_IMAGE_TREE}; {RUN_MAIN}", "envtest", "status", "--dir", str(tmp_path)],
        cwd=tmp_path,
        env=_env(image_tree),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("kproxy: envtest: the local cluster (kproxy.localcluster) is not installed")
    assert "Traceback" not in proc.stderr


# Import names that are no installed distribution's here: the standard library's from 3.14.
STDLIB_LATER = {"compression": "backports.zstd"}  # compression.zstd (PEP 784), the backport before


def _imports(tree: ast.AST, optional: bool) -> list[ast.Import | ast.ImportFrom]:
    """Every import; with ``optional=False`` not those in a ``try`` that falls back on ImportError."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if (
            not optional
            and isinstance(node, ast.Try)
            and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers
            )
        ):
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _third_party_imports(tree: Path, optional: bool) -> dict[str, set[str]]:
    """{distribution: modules importing it} for every non-stdlib, non-kproxy import (lazy ones too)."""
    dists = metadata.packages_distributions()
    found: dict[str, set[str]] = {}
    for name, path in _modules(tree).items():
        for node in _imports(ast.parse(path.read_text()), optional):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top == "kproxy" or top in sys.stdlib_module_names:
                    continue
                dist = STDLIB_LATER.get(top) or dists.get(top, [top])[0]
                found.setdefault(canonicalize_name(dist), set()).add(name)
    return found


def _closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements pull in, as installed here (markers for this interpreter)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (req.marker and not req.marker.evaluate({"extra": ""})) or name in seen:
            continue
        seen.add(name)
        todo.extend(Requirement(r) for r in metadata.requires(req.name) or [])
    return seen


def test_runtime_dependencies_are_what_the_image_imports(image_tree: Path) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    imported = _third_party_imports(image_tree, optional=True)
    # no runtime dependency that only the tests or the local cluster import ...
    assert sorted(runtime - set(imported)) == []
    # ... and nothing the image requires that `pip install kproxy` would not bring (a development
    # dependency imported there would fail at run time; optional backends have their fallback)
    installed = _closure(project["dependencies"])
    required = _third_party_imports(image_tree, optional=False)
    assert {d: sorted(m) for d, m in required.items() if d not in installed} == {}
    # cryptography: the persisted watch cache's AES-GCM, lazily (kproxy/cacher/persist.py)
    assert "kproxy.cacher.persist" in imported["cryptography"]
    assert not any(re.match(r"kproxy\.(testing|localcluster)\b", m) for m in imported["cryptography"])
