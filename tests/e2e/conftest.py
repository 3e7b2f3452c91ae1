"""Fixtures that run kproxy itself (as a real `kproxy run` process) in front of the control plane."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kproxy.testing.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy


@pytest.fixture(scope="session")
def proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with `credentials: proxy` and an empty chain, in front of the control plane."""
    rp = start_proxy(tmp_path_factory.mktemp("kproxy"), control_plane.admin_kubeconfig)
    yield rp
    rp.stop()


@pytest.fixture(scope="session")
def forward_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with `credentials: forward`: callers' bearer tokens reach the apiserver unchanged."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-fwd"), control_plane.admin_kubeconfig, credentials="forward", tls=True
    )
    yield rp
    rp.stop()


@pytest.fixture
def proxy_factory(tmp_path: Path, control_plane: ControlPlaneInfo) -> Iterator[Callable[..., RunningProxy]]:
    """Start extra kproxy processes for one test (stopped afterwards)."""
    started: list[RunningProxy] = []

    def make(**kwargs: Any) -> RunningProxy:
        upstream = kwargs.pop("upstream_kubeconfig", control_plane.admin_kubeconfig)
        rp = start_proxy(tmp_path / f"p{len(started)}", upstream, **kwargs)
        started.append(rp)
        return rp

    yield make
    for rp in started:
        rp.stop(signal.SIGKILL)
