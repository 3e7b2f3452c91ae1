"""The ``dryrun`` filter: by policy, mutating requests run with ``dryRun=All`` (or are refused).

Rules are evaluated in order and the first match decides (see :mod:`kproxy.identity.policy`):

* ``enforce`` -- every matching mutating request (POST, PUT, PATCH of every kind including
  server-side apply, DELETE and deletecollection, subresources such as ``status``, ``scale``,
  ``eviction``, ``binding``) goes upstream as a dry run. The response carries
  ``Warning: 299 - "..."`` naming the rule. Streaming subresources (exec, attach, portforward,
  proxy) cannot be dry-run and are refused with a 403 Status.
* ``reject`` -- a matching mutating request that is not already a valid dry run gets a 403
  Status naming the rule.
* ``allow`` -- passes unchanged.

Reads (get, list, watch) always pass. How the apiserver reads ``dryRun``, and therefore what
this filter must cover so that it cannot be bypassed (apiserver v1.37 sources):

* Query parameters are decoded by Go's ``url.ParseQuery`` (pairs split on ``&``; a pair with
  ``;`` or a bad ``%`` escape is dropped; ``%xx`` and ``+`` decoded in keys and values) and read
  with a case-sensitive map lookup of ``dryRun`` (zz_generated.conversion.go): every value
  must be ``All`` (``ValidateDryRun``), else the request is a 422 naming ``CreateOptions``,
  ``UpdateOptions``, ``PatchOptions`` or ``DeleteOptions``. Under ``enforce`` kproxy removes
  every pair whose decoded key is ``dryRun`` in any letter case and appends ``dryRun=All``; a
  client-supplied invalid value gets the apiserver's own 422, built here, never forwarded.
* Create, update and patch options come from the query only (create.go, update.go, patch.go);
  a ``dryRun`` field in their body is just an unknown field of the object.
* DELETE and deletecollection (delete.go): a non-empty body is decoded as ``DeleteOptions``
  (JSON, YAML or protobuf by ``Content-Type``; absent = JSON) and the query's ``dryRun`` is
  then ignored. So kproxy reads every DELETE body and, under ``enforce``, rewrites it with
  ``dryRun: ["All"]`` (JSON and YAML become JSON; protobuf is edited in its wire form). A body
  it cannot parse, or of another media type, is refused, never forwarded. ``null`` (which Go
  decodes as empty options) becomes ``{"dryRun":["All"]}``.
* A DELETE body is decoded as the apiserver decodes it, with its limits: YAML through
  ``kproxy.gocompat.yaml`` (go-yaml's depth and alias budget, first document only), JSON with
  Go's nesting limit; a body it refuses gets its own 400 word for word. Large bodies are decoded
  off the event loop (``kproxy.core.offload``).
* Authentication and authorization come first at the apiserver, so kproxy reads no body and
  answers nothing of its own (a rule's 403, a 422 for ``dryRun``, a 400 for a body) before it
  knows the apiserver would authorize the caller (a SubjectAccessReview, cached); a caller it
  would refuse gets its 401 or 403.
* The Namespace object is in itself for a rule's ``namespaces`` (:mod:`kproxy.identity.policy`): creating
  ``dry-x`` (the name read from the body) is a dry run under a ``dry-*`` rule, as changing and
  deleting it are.
* ``serviceaccounts/token`` (TokenRequest) ignores ``dryRun``: a dry run still returns a real,
  valid token, so matching ``enforce`` and ``reject`` rules refuse it.
* ``X-HTTP-Method-Override`` is honoured by neither Go's server nor the apiserver: the method
  on the wire is what runs, and RequestInfo is computed from it. A method in lower case
  (``delete``) matches no apiserver route; kproxy still treats it as the mutation it names.

Package: ``filter.py`` is the filter (``DryRun``), ``rules.py`` its settings (the rules), ``query.py``
how the apiserver reads ``dryRun`` from the query, ``deleteoptions.py`` how it reads (and kproxy
rewrites) a DELETE body's DeleteOptions (JSON, YAML, protobuf). The package re-exports them.
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

from kproxy.filters.dryrun.deleteoptions import (
    BodyError,
    NotJSON,
    NotYAML,
    UnsupportedBodyType,
    delete_body_dry_run,
    enforce_delete_body,
    media_type,
)
from kproxy.filters.dryrun.filter import DryRun, warning_value
from kproxy.filters.dryrun.query import DRY_RUN_ALL, enforce_query, invalid_dry_run, is_dry_run, query_dry_run
from kproxy.filters.dryrun.rules import DryRunRule, DryRunSettings

__all__ = [
    "DRY_RUN_ALL",
    "BodyError",
    "DryRun",
    "DryRunRule",
    "DryRunSettings",
    "NotJSON",
    "NotYAML",
    "UnsupportedBodyType",
    "delete_body_dry_run",
    "enforce_delete_body",
    "enforce_query",
    "invalid_dry_run",
    "is_dry_run",
    "media_type",
    "query_dry_run",
    "warning_value",
]
