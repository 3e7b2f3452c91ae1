"""Who the caller is and what they may do.

Owns: ``authn`` (authenticating callers: client certificates, bearer tokens via TokenReview),
``impersonate`` (the impersonation headers kproxy sends upstream), ``access`` (SubjectAccessReview
decisions, cached), ``policy`` (the rules filters match requests against), ``ttlcache`` (the
expiring LRU both review caches use).

May import: ``core`` and the engines. Never ``kproxy.server`` or ``kproxy.filters``.
"""
