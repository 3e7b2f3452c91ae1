"""The listener and its HTTP plumbing: everything between a client's socket and the apiserver's.

Owns: ``proxy`` (ProxyServer: the listener, the chain, the upstream), ``listener`` (Go's HTTP/1.1
edge rules on aiohttp's server), ``connections``, ``pool`` and ``upstream`` (the upstream
connection pool and the last handler of the chain), ``upgrade`` (exec/attach/port-forward
splicing), ``reload`` (hot reload of the config), ``httputil``, ``tlschain``, ``kubeconfig``
(upstream TLS and credentials), ``metrics`` (the Prometheus registry), ``servedresources``
(discovery for the admin listener), ``proxyguard`` (``kubectl proxy`` mode's request guard).

May import everything below it: ``core``, ``identity``, ``filters`` (the registry), the engines,
``config``, ``gctuning``. Nothing imports the server except ``kproxy.cli``.
"""
