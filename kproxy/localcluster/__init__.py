"""The local cluster: a real Kubernetes control plane on this host, and the living cluster on it.

``kproxy envtest up|down|status|run`` and ``make run``: etcd and kube-apiserver built from the pinned
release (``envtest``), and, with ``--components``, a ``kproxy run`` in front of them, the real
controller-manager and scheduler and KWOK nodes (``cluster``), with the walk-through ``make run``
prints (``localrun``, ``walkthrough``). Tests and benchmarks start it through the same API.

Modules:

* :mod:`kproxy.localcluster.envtest` - the public API (import from here) and the ``kproxy envtest`` CLI;
  it re-exports :mod:`~kproxy.localcluster.binaries`, :mod:`~kproxy.localcluster.lifecycle`,
  :mod:`~kproxy.localcluster.controlplane`, :mod:`~kproxy.localcluster.kubeconfigs`,
  :mod:`~kproxy.localcluster.kubectl` and :mod:`~kproxy.localcluster.errors`, built on
  :mod:`~kproxy.localcluster.state` and :mod:`~kproxy.localcluster.processes`.
* :mod:`kproxy.localcluster.certs` - the throwaway PKI the control plane runs on.
* :mod:`kproxy.localcluster.cluster` - the living cluster's components beside the control plane.
* :mod:`kproxy.localcluster.localrun` - ``kproxy envtest run`` (``make run``): up, the walk-through
  (:mod:`kproxy.localcluster.walkthrough`), down on Ctrl-C.

Nothing that ``kproxy run`` loads imports this package (an import contract in pyproject.toml): only
the CLI's ``envtest`` command does, lazily. It does not ship in the container image (.dockerignore),
and it imports nothing from :mod:`kproxy.testing` (the test doubles).
"""
