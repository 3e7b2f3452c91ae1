"""Test support for kproxy: a real local control plane (etcd + kube-apiserver) and pytest fixtures.

Modules:

* :mod:`kproxy.testing.certs` - the throwaway PKI the control plane runs on.
* :mod:`kproxy.testing.envtest` - the control plane's public API (import from here) and its CLI;
  it re-exports :mod:`~kproxy.testing.binaries`, :mod:`~kproxy.testing.lifecycle`,
  :mod:`~kproxy.testing.controlplane`, :mod:`~kproxy.testing.kubeconfigs`, :mod:`~kproxy.testing.kubectl`
  and :mod:`~kproxy.testing.errors`, built on :mod:`~kproxy.testing.state` and :mod:`~kproxy.testing.processes`.
* :mod:`kproxy.testing.proxyproc` - run ``kproxy run`` as a real process.
* :mod:`kproxy.testing.pytest_plugin` - ``control_plane``, ``kubectl`` and ``namespace`` fixtures.
* :mod:`kproxy.testing.replay` - a test upstream replaying apiserver answers recorded by
  :mod:`kproxy.testing.record` (``python -m kproxy.testing.record`` re-records them);
  :mod:`kproxy.testing.inprocess` runs the real ``ProxyServer`` in front of it in the test process.
* :mod:`kproxy.testing.exchange` - ``make_exchange``: an ``Exchange`` built as the server builds one.

Nothing here is imported by kproxy itself, so production code never pulls in
test-only dependencies.
"""
