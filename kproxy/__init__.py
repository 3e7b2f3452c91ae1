"""kproxy: a Kubernetes API gateway.

Packages, from the bottom up (a package imports only from those listed before it; checked by
``lint-imports``, see ``[tool.importlinter]`` in pyproject.toml):

* ``gocompat``  -- faithful ports of Go's parsers and encoders (imports nothing else of kproxy);
* ``codegen``   -- runs the code the engines generate, named for tracebacks and dumpable (imports
  nothing else of kproxy; ``python -m kproxy.codegen --dump DIR`` drives the engines);
* ``codec``, ``compress`` -- libraries: the Kubernetes protobuf/JSON/YAML codec; gzip/zstd;
* ``cacher``    -- the watch-cache engine (Reflector, WatchCache, broadcaster) and the selectors;
* ``core``      -- what every filter sees: Exchange, Reply, Body, Filter, Chain, RequestInfo,
  negotiation, Status and its negotiated writer, FilterContext;
* ``identity``  -- authentication, impersonation, access reviews, policy rules;
* ``filters``   -- the registry, and one package per built-in filter (filters never import each other);
* ``server``    -- the listener, the proxy server, the upstream pool, upgrades, hot reload, metrics;
* ``cli``, ``config``, ``logs``, ``gctuning`` -- the command line and process-wide settings.

Engines (``gocompat``, ``codec``, ``compress``, ``cacher``) import no aiohttp. ``localcluster`` is
the local cluster (``kproxy envtest``, ``make run``), ``testing`` the test doubles; nothing that
``kproxy run`` loads imports either (the CLI loads ``localcluster`` for ``envtest`` only), and the
container image carries neither.
"""

# The one version source: pyproject.toml reads it ([tool.setuptools.dynamic]); CHANGELOG.md has an entry for it.
__version__ = "0.1.0"
