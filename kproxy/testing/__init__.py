"""Test support for kproxy: a real local control plane (etcd + kube-apiserver) and pytest fixtures.

Modules:

* :mod:`kproxy.testing.certs` - the throwaway PKI the control plane runs on.
* :mod:`kproxy.testing.envtest` - build/cache the binaries; ``up``/``down``/``status``; CLI.
* :mod:`kproxy.testing.pytest_plugin` - ``control_plane``, ``kubectl`` and ``namespace`` fixtures.

Nothing here is imported by kproxy itself, so production code never pulls in
test-only dependencies.
"""
