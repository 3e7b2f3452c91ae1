"""Benchmarks for kproxy: ``python -m benchmarks.<scenario>`` (``make bench``: ``benchmarks.proxies``);
see benchmarks/README.md."""
