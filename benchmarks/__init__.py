"""Benchmarks for kproxy: ``python -m benchmarks.run`` (or ``make bench``); see benchmarks/README.md."""
