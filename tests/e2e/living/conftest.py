"""The living cluster for end-to-end tests: its own control plane with the real controllers and KWOK nodes.

Its own control plane (a few seconds to start) rather than the session's: the controllers act on
everything (garbage collection, namespace deletion, scheduling), which other tests' leftovers must not
meet, and the chaos tests stop its apiserver. ``living`` starts no components: each test module runs
them ``direct`` or ``proxied`` with :func:`kproxy.localcluster.cluster.running_components`.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator

import pytest

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo


@pytest.fixture(scope="session")
def living(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A fresh control plane for the living-cluster tests (components started by each module)."""
    directory = tmp_path_factory.mktemp("living")
    atexit.register(envtest.down, directory)
    try:
        yield envtest.up(directory)
    finally:
        envtest.down(directory)
        atexit.unregister(envtest.down)
