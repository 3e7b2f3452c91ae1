"""pytest fixtures around the local control plane.

Enable with ``pytest_plugins = ["kproxy.testing.pytest_plugin"]`` in the root conftest.

* ``control_plane`` (session): one etcd + kube-apiserver per test run.  If
  ``$KPROXY_ENVTEST_DIR`` names a directory where ``kproxy envtest up`` is
  running, it is reused and left running (fast inner loop); otherwise a fresh
  one is started in a pytest tmp dir and stopped at the end of the session.
* ``kubectl`` (session): :class:`kproxy.localcluster.envtest.Kubectl`, the kubectl
  of the same release, defaulting to the admin kubeconfig.
* ``namespace`` (function): a fresh namespace per test.

Fixtures are synchronous (subprocess + http.client), so they work with any
event-loop scope.

Building the binaries can take far longer than the per-test timeout, so it
happens in ``pytest_collection_finish`` (outside any test's timeout) and only
when a selected test needs ``control_plane``.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import re
import secrets
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster import envtest

__all__ = ["control_plane", "kubectl", "namespace"]

_BINS_KEY = pytest.StashKey[envtest.BinPaths | BaseException]()


def _reusable_dir() -> Path | None:
    """The ``$KPROXY_ENVTEST_DIR`` control plane if it is up right now, else None."""
    env = os.environ.get(envtest.DIR_ENV)
    if env and envtest.status(Path(env)).up:
        return Path(env)
    return None


def _capture_disabled(config: pytest.Config) -> contextlib.AbstractContextManager[Any]:
    """Let build output through to the terminal: a silent 20-minute pause looks like a hang."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        return contextlib.nullcontext()
    cm: contextlib.AbstractContextManager[Any] = capman.global_and_fixture_disabled()
    return cm


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build or find the binaries before any test starts, if a selected test needs them."""
    config = session.config
    if config.option.collectonly:
        return
    if not any("control_plane" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    if _reusable_dir() is not None:
        return
    try:
        with _capture_disabled(config):
            config.stash[_BINS_KEY] = envtest.ensure_binaries()
    except Exception as e:  # reported by the fixture, once per test that needs it
        config.stash[_BINS_KEY] = e


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[envtest.ControlPlaneInfo]:
    """One running control plane for the whole session (reused from ``$KPROXY_ENVTEST_DIR`` if up)."""
    reuse = _reusable_dir()
    if reuse is not None:
        yield envtest.load(reuse)
        return

    bins = request.config.stash.get(_BINS_KEY, None)
    if isinstance(bins, BaseException):
        pytest.fail(f"envtest binaries unavailable: {bins}", pytrace=False)
    if bins is None:  # e.g. requested dynamically via getfixturevalue
        with _capture_disabled(request.config):
            bins = envtest.ensure_binaries()

    directory = tmp_path_factory.mktemp("envtest")

    def stop() -> None:
        envtest.down(directory)

    # A session that dies between up and teardown (KeyboardInterrupt, internal error) still runs
    # atexit handlers; down() is idempotent, so running both is harmless.
    atexit.register(stop)
    try:
        yield envtest.up(directory, bins=bins)
    finally:
        try:
            stop()
        finally:
            atexit.unregister(stop)


@pytest.fixture(scope="session")
def kubectl(control_plane: envtest.ControlPlaneInfo) -> envtest.Kubectl:
    """``kubectl(args, kubeconfig=..., check=True, input=None, timeout=60) -> CompletedProcess[str]``."""
    return control_plane.kubectl_runner()


def _namespace_name(test_name: str) -> str:
    """A DNS-1123 label naming the test (for debugging) plus a random suffix (for uniqueness)."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-") or "test"
    return f"{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(control_plane: envtest.ControlPlaneInfo, request: pytest.FixtureRequest) -> Iterator[str]:
    """Create a uniquely named namespace as admin; delete it afterwards without waiting.

    With no controller-manager, a deleted namespace stays Terminating forever,
    so teardown only issues the DELETE (unique names make leftovers harmless).
    """
    name = _namespace_name(request.node.name)
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kproxy-tests"}},
    }
    code, resp = control_plane.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
    if code != 201:
        pytest.fail(f"creating namespace {name}: HTTP {code}: {resp[:500]!r}", pytrace=False)
    yield name
    try:
        code, resp = control_plane.request("DELETE", f"/api/v1/namespaces/{name}")
    except (OSError, http.client.HTTPException) as e:  # e.g. the test left the apiserver stopped
        warnings.warn(f"could not delete namespace {name}: {e}", stacklevel=1)
        return
    if code not in (200, 202, 404):
        warnings.warn(f"deleting namespace {name}: HTTP {code}: {resp[:300]!r}", stacklevel=1)
