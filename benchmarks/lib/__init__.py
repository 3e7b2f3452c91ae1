"""What every benchmark scenario shares; scenarios import from here and never from each other.

* :mod:`benchmarks.lib.common`: errors, logging, work directories, the machine and software lines
  of a report.
* :mod:`benchmarks.lib.stats`: the one percentile definition (nearest rank).
* :mod:`benchmarks.lib.procs`: process CPU seconds, machine busy time, RSS, servers started in
  their own process group.
* :mod:`benchmarks.lib.cluster`: the control plane, kproxy and kubectl proxy as peers, kproxy's
  metrics.
* :mod:`benchmarks.lib.data`: the ConfigMaps and realistic pods benchmarks read, and seeding them.
* :mod:`benchmarks.lib.report`: number formatting for the markdown tables.
* :mod:`benchmarks.lib.load`: the closed-loop HTTP load generator (a process of its own);
  :mod:`benchmarks.lib.h2load`: nghttp2's ``h2load`` (its command line and summary).
* :mod:`benchmarks.lib.fanout`: the watch fan-out harness (watchers, writer, CPU window).
* :mod:`benchmarks.lib.watch_client`, :mod:`benchmarks.lib.h2_watch_client`,
  :mod:`benchmarks.lib.watch_writer`, :mod:`benchmarks.lib.fairness_load`: the processes those
  harnesses start.
"""
