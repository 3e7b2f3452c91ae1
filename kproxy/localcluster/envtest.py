"""A real, local Kubernetes control plane for tests: etcd + kube-apiserver ("envtest").

Why a real apiserver instead of a fake: kproxy is a transparent streaming proxy,
and the behaviours worth testing (watch streams, chunked lists, protobuf,
authn/authz errors, upstream outages) are exactly the ones a fake gets subtly
wrong.  No kubelet, scheduler or controller-manager run here, so pods never
start and namespaces never finish deleting; everything the API server does on
its own (storage, validation, RBAC, watch) is real.

This module is the public face (import from here) and the ``kproxy envtest``
CLI; the pieces live in:

* :mod:`kproxy.localcluster.binaries` - the pinned release; finding, caching and building the binaries.
* :mod:`kproxy.localcluster.lifecycle` - ``up``/``down``/``status`` of a control-plane directory (and its layout).
* :mod:`kproxy.localcluster.controlplane` - :class:`ControlPlaneInfo`: talk to and disturb a running one; ``load``.
* :mod:`kproxy.localcluster.state` - the directory's ``state.json`` and lock.
* :mod:`kproxy.localcluster.processes` - detached processes: spawn, liveness, terminate; ports, log tails.
* :mod:`kproxy.localcluster.kubeconfigs` / :mod:`kproxy.localcluster.kubectl` - client side.
* :mod:`kproxy.localcluster.errors` - :class:`EnvtestError` and :class:`ControlPlaneError`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from kproxy.localcluster.binaries import BIN_DIR_ENV, BinPaths, default_cache_dir, ensure_binaries, k8s_version
from kproxy.localcluster.binaries import BINARIES as BINARIES
from kproxy.localcluster.cluster import MODES, start_components
from kproxy.localcluster.controlplane import USER_NAME, ControlPlaneInfo, load
from kproxy.localcluster.errors import ControlPlaneError, EnvtestError
from kproxy.localcluster.kubeconfigs import write_kubeconfig
from kproxy.localcluster.kubectl import Kubectl, KubectlError
from kproxy.localcluster.lifecycle import ControlPlaneStatus, down, status, up
from kproxy.localcluster.localrun import run_foreground
from kproxy.localcluster.processes import _CHILDREN as _CHILDREN
from kproxy.localcluster.processes import _spawn as _spawn
from kproxy.localcluster.state import _ProcState as _ProcState
from kproxy.localcluster.state import _State as _State
from kproxy.localcluster.state import _write_state as _write_state

# The ``X as X`` imports above are re-exported too, outside __all__: the envtest tests use
# BINARIES and the private bookkeeping (_CHILDREN, _spawn, _ProcState, _State, _write_state) from here.
__all__ = [
    "BIN_DIR_ENV",
    "DIR_ENV",
    "USER_NAME",
    "BinPaths",
    "ControlPlaneError",
    "ControlPlaneInfo",
    "ControlPlaneStatus",
    "EnvtestError",
    "Kubectl",
    "KubectlError",
    "default_cache_dir",
    "down",
    "ensure_binaries",
    "k8s_version",
    "load",
    "main",
    "status",
    "up",
    "write_kubeconfig",
]

#: A control-plane directory started with ``kproxy envtest up``; the pytest plugin reuses it.
DIR_ENV = "KPROXY_ENVTEST_DIR"


def main(argv: Sequence[str] | None = None) -> int:
    """``kproxy envtest {build,up,down,status,run} [--dir DIR]``; returns the exit code."""
    env_dir = os.environ.get(DIR_ENV)
    parser = argparse.ArgumentParser(
        prog="kproxy envtest",
        description="Run a local etcd + kube-apiserver for kproxy development and tests.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find) the pinned etcd/kube-apiserver/kubectl and print their dir")
    for name, help_ in (
        ("up", "start a fresh control plane in DIR"),
        ("down", "stop the control plane in DIR"),
        ("status", "exit 0 if the control plane in DIR is up, 1 if not"),
        ("run", "run the living cluster through a kproxy in the foreground until Ctrl-C (what `make run` does)"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--dir",
            type=Path,
            default=Path(env_dir) if env_dir else None,
            required=not env_dir,
            help=f"control-plane directory (default: ${DIR_ENV}, which is {env_dir!r})"
            if env_dir
            else f"control-plane directory (required: ${DIR_ENV} is not set)",
        )
        if name == "run":
            p.add_argument("--config", type=Path, required=True, help="kproxy config (filters, listen, admin_listen)")
            p.add_argument("--nodes", type=int, default=3, help="simulated nodes (default: 3)")
        if name == "up":
            p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
            p.add_argument(
                "--components",
                choices=("none", *MODES),
                default="none",
                help="also run kube-controller-manager, kube-scheduler and kwok nodes: 'proxied' through a kproxy "
                "started from --config (every informer, lease, status update and bind crosses its chain), "
                "'direct' against the apiserver (default: none)",
            )
            p.add_argument("--config", type=Path, help="kproxy config for --components proxied (filters, listen)")
            p.add_argument("--nodes", type=int, default=3, help="simulated nodes with --components (default: 3)")
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2

    try:
        if args.command == "build":
            print(ensure_binaries().dir)
            return 0
        directory: Path = args.dir.absolute()
        if args.command == "run":
            return run_foreground(directory, args.config, nodes=args.nodes)
        if args.command == "up":
            started = time.monotonic()
            info = up(directory, timeout=args.timeout)
            server = None
            if args.components != "none":
                try:
                    proxy_cfg = yaml.safe_load(args.config.read_text()) if args.config else {}
                    server = start_components(
                        info, mode=args.components, proxy=proxy_cfg or {}, nodes=args.nodes, timeout=args.timeout
                    )
                except BaseException:
                    down(directory)
                    raise
            print(f"envtest {info.version} is up ({time.monotonic() - started:.1f}s)")
            print(f"  server:           {info.server}")
            print(f"  admin kubeconfig: {info.admin_kubeconfig}")
            print(f"  user kubeconfig:  {info.user_kubeconfig}  ({info.user_name}, no RBAC bindings)")
            print(f"  kubectl:          {info.kubectl}")
            print(f"  logs:             {info.etcd_log} {info.apiserver_log}")
            if server is not None:
                print(f"  components:       controller-manager, scheduler, kwok ({args.nodes} nodes) -> {server}")
                if args.components == "proxied":
                    print(f"  kproxy:           {server}  config {directory / 'kproxy.yaml'}")
                    print(f"  kproxy log:       {directory / 'kproxy.log'}")
            print(f"export KUBECONFIG={info.admin_kubeconfig}")
            print(f"export {DIR_ENV}={directory}")
            print(f"stop with: kproxy envtest down --dir {directory}")
            return 0
        if args.command == "down":
            print(f"stopped control plane in {directory}" if down(directory) else f"nothing running in {directory}")
            return 0
        st = status(directory)
        print(st.summary())
        return 0 if st.up else 1
    except EnvtestError as e:
        print(f"kproxy envtest {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
