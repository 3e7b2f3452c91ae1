"""What `kproxy run` loads before it listens, and what the image compiles so that a start does not.

A restarted node-local kproxy serves its persisted cache once it listens, so everything imported
before that delays the first answer (docs/capacity.md, start time). These tests run `kproxy run`
in a subprocess (plain HTTP, an upstream that refuses connections: kproxy listens anyway), record
``sys.modules`` the moment the listeners are bound, and check that modules needed only by some
answers or other configurations are not among them. Not timed: the set of modules is what drifts
when an import moves to a module's top, and it is the same on a loaded machine as on an idle one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kproxy.testing.unreachable import unreachable_config

REPO = Path(__file__).resolve().parents[2]

# Runs `kproxy run` with ProxyServer.start wrapped: once both listeners are bound, the loaded
# modules are written out and the process stops itself the way an operator would (SIGTERM).
PROBE = textwrap.dedent(
    """
    import json, os, signal, sys
    from kproxy.cli import main
    import kproxy.server.proxy as proxy

    started = proxy.ProxyServer.start

    async def start(self):
        await started(self)
        with open(os.environ["KPROXY_TEST_MODULES_OUT"], "w") as out:
            json.dump(sorted(sys.modules), out)
        os.kill(os.getpid(), signal.SIGTERM)

    proxy.ProxyServer.start = start
    sys.exit(main(sys.argv[1:]))
    """
)

# Loaded only by what needs them, never before listening in the configurations below.
NEVER_AT_START = [
    "kproxy.testing",  # test support: `kproxy envtest` alone
    "kproxy.codec.yamlcodec",  # YAML answers: the first request asking for application/yaml
    "kproxy.gocompat.yaml",
    "cryptography",  # the persisted cache's encryption: only with an encryption key configured
    "grpc",  # development tools (`make proto`), never at run time
    "grpc_tools",
    "hypothesis",
    "pytest",
    "google.protobuf.json_format",
]


def _modules_at_listen(tmp_path: Path, filters: list[dict[str, Any]]) -> set[str]:
    unreachable_config(tmp_path, filters)  # kproxy listens anyway
    out = tmp_path / "modules.json"
    env = {**os.environ, "KPROXY_TEST_MODULES_OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "run", "--config", str(tmp_path / "kproxy.yaml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert out.exists(), f"kproxy did not listen (exit {proc.returncode}): {proc.stderr.decode()[-2000:]}"
    modules: list[str] = json.loads(out.read_text())
    assert "kproxy.server.proxy" in modules and "aiohttp.web" in modules  # the probe saw a real start
    return set(modules)


def _loaded(modules: set[str], names: list[str]) -> list[str]:
    return sorted(m for m in modules for n in names if m == n or m.startswith(n + "."))


def test_a_node_local_restart_loads_only_what_listening_and_the_cache_need(tmp_path: Path) -> None:
    # The node-local restart: the watch cache, persisted.
    persist = tmp_path / "state"
    filters = [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(persist)}}]
    modules = _modules_at_listen(tmp_path, filters)
    assert "kproxy.filters.watchcache" in modules and "kproxy.codec.schema" in modules
    assert _loaded(modules, NEVER_AT_START) == []
    # The filters that are not configured are not loaded either.
    others = ["kproxy.filters.compression", "kproxy.filters.dryrun", "kproxy.filters.transcode"]
    assert _loaded(modules, [*others, "kproxy.filters.validation"]) == []


def test_a_gateway_without_filters_loads_no_codec(tmp_path: Path) -> None:
    modules = _modules_at_listen(tmp_path, [])
    # The protobuf schema and its runtime are the cache's and the transcoder's, loaded with them.
    heavy = ["kproxy.codec", "google.protobuf", "kproxy.filters.watchcache", "msgspec"]
    assert _loaded(modules, [*NEVER_AT_START, *heavy]) == []


@pytest.mark.parametrize("stage", ["build", "runtime"])
def test_the_image_carries_its_bytecode_compiled(stage: str) -> None:
    # The python image deletes its standard library's .pyc files and the runtime stage writes none
    # (PYTHONDONTWRITEBYTECODE, read-only root fs): the build compiles the standard library (and the
    # venv, hash-checked so the copies' mtimes do not matter) and the runtime stage copies it.
    dockerfile = (REPO / "Dockerfile").read_text()
    build, runtime = dockerfile.split("\nFROM ")[1:]
    if stage == "build":
        compiles = re.findall(r"compileall (.+)", build)
        assert any(c.endswith("/usr/local/lib/python${PYTHON_VERSION}") for c in compiles), compiles
        assert any(c.endswith("/opt/kproxy") and "-f " in c for c in compiles), compiles
        assert all("--invalidation-mode unchecked-hash" in c for c in compiles), compiles
    else:
        assert "PYTHONDONTWRITEBYTECODE=1" in runtime
        copy = "COPY --from=build /usr/local/lib/python${PYTHON_VERSION} /usr/local/lib/python${PYTHON_VERSION}"
        assert copy in runtime
        assert "ARG PYTHON_VERSION\n" in runtime
