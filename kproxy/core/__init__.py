"""The request core every filter sees.

Owns: ``chain`` (Exchange, Reply, Body, Filter, Chain), ``requestinfo`` (RequestInfo, parsed as
the apiserver's RequestInfoFactory does), ``negotiation`` (media types), ``status`` (Status errors),
``errorreply`` (the Status writer in the negotiated media type), ``upstreamgzip`` (a reply the
upstream gzipped, decoded once for whichever filter reads it), ``context`` (FilterContext, its ApiClient, and the
``UpstreamLine`` protocol that client calls), ``eventstream`` (watch event-stream bodies),
``offload`` (body work kept off the event loop), ``discovery`` (the one reader of discovery
and, in ``crdfeed``, the one list+watch of CRDs, offered as ``FilterContext.discovery``),
``listwatch`` (a list+watch's line to the apiserver).

May import: ``gocompat``, ``codec``, ``compress``, ``cacher`` (engines), aiohttp. Never
``kproxy.server``, ``kproxy.identity`` or ``kproxy.filters``.
"""
