"""Fixtures that run kproxy itself (as a real `kproxy run` process) in front of the control plane."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus.compare import Sides

from kproxy.localcluster.envtest import ControlPlaneInfo
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


@pytest.fixture(scope="module")
def pb_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with the transcode filter asking the apiserver for protobuf (one per test module)."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-transcode"),
        control_plane.admin_kubeconfig,
        extra={"filters": [{"name": "transcode", "upstream": "protobuf"}]},
    )
    yield rp
    rp.stop()


@pytest.fixture
async def sides(control_plane: ControlPlaneInfo, pb_proxy: RunningProxy) -> AsyncIterator[Sides]:
    """The same request sent directly and through ``pb_proxy``, side by side."""
    s = Sides(control_plane, pb_proxy.url)
    yield s
    await s.close()
