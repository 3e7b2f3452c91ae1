"""Present the client certificate chain exactly as configured, as client-go does.

OpenSSL, given a client certificate with no chain of its own, builds one at every handshake from
the context's trust store and sends it: a kubeconfig's leaf certificate goes out as
``[leaf, cluster CA]``. client-go (Go's crypto/tls) sends only what the kubeconfig holds. The
difference is not cosmetic: the kube-apiserver's x509 authenticator verifies the presented chain
on *every request*, and with the CA also offered as an intermediate it checks the leaf's
signature twice. Measured on the local control plane (2 cores, small GETs, 16 keep-alive
connections): 0.65 against 0.56 ms of apiserver CPU per request, 13% of it, all in P-256
arithmetic (``perf``), whether the client was aiohttp or reqwest with the CA appended.

Python's ``ssl`` module has no setter for OpenSSL's ``SSL_MODE_NO_AUTO_CHAIN``, so
:func:`send_configured_chain_only` sets it on the context's ``SSL_CTX`` through ``ctypes``: CPython's
``_ssl`` context object holds the ``SSL_CTX *`` right after its object header (unchanged since
Python 3.2). It does so only where that layout is known (CPython with the GIL), and only after
checking that the pointer found is the context's own (OpenSSL's ``SSL_CTX_get_options`` must
agree with ``ctx.options``); anywhere else it changes nothing and says so, and kproxy still
works, at the apiserver's extra cost per request.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import ssl
import sys
import sysconfig

log = logging.getLogger("kproxy.tlschain")  # the name it has always logged under

_SSL_CTRL_MODE = 33  # SSL_CTX_set_mode / SSL_CTX_get_mode are SSL_CTX_ctrl(ctx, 33, ...)
SSL_MODE_NO_AUTO_CHAIN = 0x8


@functools.cache
def _libssl() -> ctypes.CDLL | None:
    """The libssl ``_ssl`` itself uses (symbols resolve through the extension's dependencies)."""
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    if ssl.OPENSSL_VERSION_INFO < (1, 1, 0):
        return None
    try:
        # lazy: a private CPython module, used only where the configured chain must be sent as is
        import _ssl

        lib = ctypes.CDLL(_ssl.__file__)
        lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        lib.SSL_CTX_ctrl.restype = ctypes.c_long
        lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        # uint64_t in OpenSSL 3, unsigned long (64 bits on the platforms CPython runs kproxy) in 1.1.1
        lib.SSL_CTX_get_options.restype = ctypes.c_uint64
    except (OSError, AttributeError, ImportError):
        return None
    return lib


def _ssl_ctx_pointer(ctx: ssl.SSLContext, lib: ctypes.CDLL) -> int | None:
    """The context's ``SSL_CTX *``, or None when what sits there is not provably it."""
    header = object.__basicsize__  # PyObject_HEAD
    if type(ctx).__basicsize__ < header + ctypes.sizeof(ctypes.c_void_p):
        return None
    ptr = ctypes.c_void_p.from_address(id(ctx) + header).value
    if not ptr:
        return None
    if lib.SSL_CTX_get_options(ptr) != ctx.options:
        return None
    return ptr


def send_configured_chain_only(ctx: ssl.SSLContext) -> bool:
    """Stop OpenSSL from appending trust-store certificates to the client certificate it sends.

    Returns whether the context now sends only the configured chain. Call it before the context
    makes connections (each connection copies the context's mode when it is created).
    """
    lib = _libssl()
    ptr = _ssl_ctx_pointer(ctx, lib) if lib is not None else None
    if lib is None or ptr is None:
        log.info(
            "cannot set SSL_MODE_NO_AUTO_CHAIN here (%s, %s): the upstream client certificate goes out "
            "with OpenSSL's chain built from the trust store, which costs the apiserver more per request",
            sys.implementation.name,
            ssl.OPENSSL_VERSION,
        )
        return False
    # SSL_CTX_set_mode adds the bits and returns the mode that results.
    return bool(lib.SSL_CTX_ctrl(ptr, _SSL_CTRL_MODE, SSL_MODE_NO_AUTO_CHAIN, None) & SSL_MODE_NO_AUTO_CHAIN)


def ssl_ctx_mode(ctx: ssl.SSLContext) -> int:
    """OpenSSL's mode bits of the context (``SSL_CTX_get_mode``); -1 where they cannot be read."""
    lib = _libssl()
    ptr = _ssl_ctx_pointer(ctx, lib) if lib is not None else None
    if lib is None or ptr is None:
        return -1
    return int(lib.SSL_CTX_ctrl(ptr, _SSL_CTRL_MODE, 0, None))
