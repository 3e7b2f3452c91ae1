"""kproxy: a Kubernetes API gateway."""

__version__ = "0.1.0"
