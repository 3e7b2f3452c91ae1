"""Test doubles and helpers for kproxy's tests, benchmarks and third-party filters' tests.

The local control plane they run against is :mod:`kproxy.localcluster` (``kproxy envtest``).

Modules:

* :mod:`kproxy.testing.exchange` - ``make_exchange``: an ``Exchange`` built as the server builds one
  (what a filter's unit tests use, as ``examples/readonly-filter`` does).
* :mod:`kproxy.testing.replay` - a test upstream replaying apiserver answers recorded by
  :mod:`kproxy.testing.record` (``python -m kproxy.testing.record`` re-records them);
  :mod:`kproxy.testing.inprocess` runs the real ``ProxyServer`` in front of it in the test process.
* :mod:`kproxy.testing.proxyproc` - run ``kproxy run`` as a real process.
* :mod:`kproxy.testing.pytest_plugin` - ``control_plane``, ``kubectl`` and ``namespace`` fixtures.
* :mod:`kproxy.testing.eventually` - the one polling helper: a deadline, the last value in the failure.
* :mod:`kproxy.testing.crds`, :mod:`kproxy.testing.informer`, :mod:`kproxy.testing.standin_kubelet`,
  :mod:`kproxy.testing.toxiproxy`, :mod:`kproxy.testing.sockets` - CRDs, a client-go informer, a
  stand-in kubelet, a WAN in between, socket counts; :mod:`kproxy.testing.gobuild` builds the Go
  programs among them and :mod:`kproxy.testing.gooracle` (Go's own answers for the gocompat tests).

Nothing that ``kproxy run`` loads imports this package (an import contract in pyproject.toml), and it
does not ship in the container image (.dockerignore): only in the wheel, for filter authors' tests.
"""
