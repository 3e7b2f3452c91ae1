"""The hostile-request corpus for the policy filters: one line per case.

A case is a request template (``{ns}`` the namespace, ``{name}`` a fresh object name, ``{seed}``
an object that exists before the request, ``{sa}`` a service account) plus what it tries to do:

* ``create`` -- ``{name}`` must not exist afterwards;
* ``modify`` -- ``{seed}`` must be unchanged afterwards (same resourceVersion, not deleting);
* ``token``  -- the answer must not carry a service-account token.

Each case runs under the policies in ``policies``: ``enforce`` (dryrun, every write a dry run),
``reject`` (dryrun, every write that is not already a dry run refused) and ``strict``
(validation, Strict for every write; the bodies carry an unknown field, so the apiserver would
refuse them at Strict). Under every one of them nothing may be persisted.

``known`` maps an invariant name to why the case fails it today; the test module turns that into
a strict xfail of that invariant only (see test_policy_corpus.py).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from . import bodies as b

#: Placeholders, filled per side (kproxy's and the direct twin's namespace differ).
COLL = "/api/v1/namespaces/{ns}/configmaps"
SEED = "/api/v1/namespaces/{ns}/configmaps/{seed}"
TOKEN = "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"

DRYRUN = ("enforce", "reject")
ALL = ("enforce", "reject", "strict")

Body = Callable[[str, str], bytes | None]  # (namespace, name) -> body


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # create | modify | token
    method: str
    target: str
    ctype: str | None = b.JSON
    body: Body | None = None
    headers: tuple[tuple[str, str], ...] = ()
    policies: tuple[str, ...] = ALL
    known: dict[str, str] = field(default_factory=dict)

    def render(self, ns: str, name: str, seed: str, sa: str) -> tuple[str, list[tuple[str, str]], bytes | None]:
        target = self.target.format(ns=ns, name=name, seed=seed, sa=sa)
        headers = [("Accept", "application/json"), *self.headers]
        data = self.body(ns, name) if self.body else None
        if data is not None and self.ctype:
            headers.append(("Content-Type", self.ctype))
        return target, headers, data


def _unknown(ns: str, name: str) -> bytes:
    """A ConfigMap with an unknown field: fine at Warn/Ignore, refused at Strict."""
    return b.cm_json(name, bogusField="x")


def _merge(ns: str, name: str) -> bytes:
    return b'{"data":{"k":"changed"},"bogusField":"x"}'


def create(id: str, target: str = COLL, *, method: str = "POST", body: Body = _unknown, ctype: str | None = b.JSON,
           headers: tuple[tuple[str, str], ...] = (), policies: tuple[str, ...] = ALL,
           known: dict[str, str] | None = None) -> Case:  # fmt: skip
    return Case(id, "create", method, target, ctype, body, headers, policies, known or {})


def modify(id: str, method: str, target: str = SEED, *, body: Body | None = _merge, ctype: str | None = b.MERGE,
           headers: tuple[tuple[str, str], ...] = (), policies: tuple[str, ...] = ALL,
           known: dict[str, str] | None = None) -> Case:  # fmt: skip
    return Case(id, "modify", method, target, ctype, body, headers, policies, known or {})


def delete(id: str, target: str = SEED, *, body: Body | None = None, ctype: str | None = b.JSON,
           headers: tuple[tuple[str, str], ...] = (), known: dict[str, str] | None = None) -> Case:  # fmt: skip
    return Case(id, "modify", "DELETE", target, ctype, body, headers, DRYRUN, known or {})


def token(id: str, target: str = TOKEN, *, method: str = "POST", headers: tuple[tuple[str, str], ...] = (),
          known: dict[str, str] | None = None) -> Case:  # fmt: skip
    tr = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}).encode()
    return Case(id, "token", method, target, b.JSON, lambda ns, name: tr, headers, DRYRUN, known or {})


def _const(data: bytes) -> Body:
    return lambda ns, name: data



UPGRADE_WS = (("Connection", "Upgrade"), ("Upgrade", "websocket"))


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


CASES: list[Case] = [
    # --- the baseline: well-formed requests the filters must already hold -----------------------------
    create("origin-create"),
    modify("origin-merge-patch", "PATCH"),
    delete("origin-delete"),
    delete("origin-deletecollection", COLL),
    token("origin-token"),
    # --- request-target forms (Go's url.ParseRequestURI; the apiserver routes by the decoded path) ---
    create("abs-http", "http://x" + COLL),
    create("abs-https", "https://x" + COLL),
    create("abs-upper-scheme", "HTTP://X" + COLL),
    create("abs-host-port", "http://127.0.0.1:1" + COLL),
    create("abs-userinfo", "http://u:p@x" + COLL),
    create("abs-other-scheme", "foo://x" + COLL),
    create("scheme-no-authority", "x:" + COLL),
    create("double-slash-start", "/" + COLL),
    create("double-slash-inside", "/api/v1/namespaces/{ns}//configmaps"),
    create("dot-segment", "/api/v1/namespaces/{ns}/./configmaps"),
    create("dotdot-segment", "/api/v1/namespaces/{ns}/x/../configmaps"),
    create("dotdot-namespace", "/api/v1/namespaces/other/../{ns}/configmaps"),
    create("pct-dotdot", "/api/v1/namespaces/{ns}/x/%2e%2e/configmaps"),
    create("pct-slash", "/api/v1/namespaces/{ns}%2Fconfigmaps"),
    create("pct-letters", "/api/v1/namespaces/{ns}/config%6Daps"),
    create("trailing-slash", COLL + "/"),
    create("trailing-question", COLL + "?"),
    create("fragment", COLL + "#frag"),
    create("semicolon-path", COLL + ";x=1"),
    create("asterisk", "*"),
    create("upper-case-resource", "/api/v1/namespaces/{ns}/ConfigMaps"),
    create("request-line-two-spaces", COLL + " "),
    create("duplicate-content-type", ctype=b.JSON, headers=(("Content-Type", b.YAML),)),
    delete("abs-delete", "http://x" + SEED),
    modify("abs-patch", "PATCH", "http://x" + SEED),
    token("abs-token", "http://x" + TOKEN),
    token("pct-token", "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/%74oken"),
    token("dotdot-token", "/api/v1/namespaces/{ns}/serviceaccounts/{sa}/x/../token"),
    # --- query spellings (Go's url.ParseQuery: ';' or a bad escape drops the pair; keys are decoded) ---
    create("dryrun-semicolon", COLL + "?dryRun=All;", policies=DRYRUN),
    create("dryrun-bad-escape-then-all", COLL + "?dryRun=%zz&dryRun=All", policies=DRYRUN),
    create("dryrun-encoded-key", COLL + "?dry%52un=All", policies=DRYRUN),
    create("dryrun-case", COLL + "?DryRun=All", policies=DRYRUN),
    create("dryrun-lower", COLL + "?dryrun=All", policies=DRYRUN),
    create("dryrun-pair-with-semicolon", COLL + "?x=1;dryRun=All", policies=DRYRUN),
    create("dryrun-empty", COLL + "?dryRun=", policies=DRYRUN),
    create("dryrun-plus", COLL + "?dryRun=All+", policies=DRYRUN),
    create("dryrun-nul", COLL + "?dryRun=All%00", policies=DRYRUN),
    create("dryrun-duplicate", COLL + "?dryRun=All&dryRun=All", policies=DRYRUN),
    create("dryrun-encoded-amp", COLL + "?dryRun=All%26x=1", policies=DRYRUN),
    create("dryrun-brackets", COLL + "?dryRun[]=All", policies=DRYRUN),
    create("dryrun-fragment", COLL + "?dryRun=All#x", policies=DRYRUN),
    create("fv-ignore", COLL + "?fieldValidation=Ignore", policies=("strict",)),
    create("fv-ignore-semicolon", COLL + "?fieldValidation=Ignore;", policies=("strict",)),
    create("fv-bad-escape-then-ignore", COLL + "?fieldValidation=%zz&fieldValidation=Ignore", policies=("strict",)),
    create("fv-lone-percent", COLL + "?fieldValidation=%", policies=("strict",)),
    create("fv-strict-bad-escape", COLL + "?fieldValidation=Strict%zz", policies=("strict",)),
    create("fv-encoded-key", COLL + "?field%56alidation=Ignore", policies=("strict",)),
    create("fv-lower-case", COLL + "?fieldvalidation=Ignore", policies=("strict",)),
    create("fv-ignore-then-strict", COLL + "?fieldValidation=Ignore&fieldValidation=Strict", policies=("strict",)),
    create("fv-empty", COLL + "?fieldValidation=", policies=("strict",)),
    create("fv-pair-with-semicolon", COLL + "?x=1;fieldValidation=Strict", policies=("strict",)),
    # --- methods and method overrides (neither Go nor the apiserver honours an override) -------------
    create("method-lower-post", method="post"),
    create("method-mixed-post", method="PoSt"),
    create("override-get", headers=(("X-HTTP-Method-Override", "GET"),)),
    delete("delete-override-get", headers=(("X-HTTP-Method-Override", "GET"),)),
    create("put-on-collection", method="PUT"),
    modify("method-lower-patch", "patch"),
    # --- a Content-Type the caller names in Connection: hop-by-hop, so it never goes upstream -------
    create("content-type-named-in-connection", headers=(("Connection", "Content-Type"),)),
    create("content-type-named-in-connection-yaml", body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n",
           ctype=b.YAML, headers=(("Connection", "keep-alive, content-type"),)),
    # --- upgrade headers (the apiserver upgrades only connect subresources and WebSocket watches) ----
    create("upgrade-websocket-create", headers=UPGRADE_WS),
    create("upgrade-h2c-create", headers=(("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"))),
    create("upgrade-x-create", headers=(("Connection", "Upgrade"), ("Upgrade", "x"))),
    create("upgrade-yaml-create", body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n", ctype=b.YAML,
           headers=UPGRADE_WS),
    create("upgrade-chunked-create", headers=(*UPGRADE_WS, ("Transfer-Encoding", "chunked")),
           body=lambda ns, name: _chunked(_unknown(ns, name))),
    create("upgrade-apply-create", "/api/v1/namespaces/{ns}/configmaps/{name}?fieldManager=adv", method="PATCH",
           ctype=b.APPLY_YAML, body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n", headers=UPGRADE_WS),
    modify("upgrade-merge-patch", "PATCH", headers=UPGRADE_WS),
    modify("upgrade-strategic-patch", "PATCH", ctype=b.STRATEGIC, headers=UPGRADE_WS),
    modify("upgrade-json-patch", "PATCH", ctype=b.JSON_PATCH, headers=UPGRADE_WS, body=_const(
        b'[{"op":"add","path":"/data/k","value":"changed"},{"op":"add","path":"/bogusField","value":"x"}]')),
    delete("upgrade-delete", headers=UPGRADE_WS),
    token("upgrade-token", headers=UPGRADE_WS),
    # --- verbs from the path prefix and methods without a verb: the apiserver routes no write there ---
    create("watch-prefix-post", "/api/v1/watch/namespaces/{ns}/configmaps"),
    create("proxy-prefix-post", "/api/v1/proxy/namespaces/{ns}/configmaps"),
    create("method-options", method="OPTIONS"),
    create("method-connect", method="CONNECT"),
    create("method-propfind", method="PROPFIND"),
    create("method-connect-upgrade", method="CONNECT", headers=UPGRADE_WS),
    # --- every body media type ------------------------------------------------------------------------
    create("yaml-create", body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n", ctype=b.YAML),
    create("protobuf-create", body=lambda ns, name: b.cm_protobuf(name), ctype=b.PROTOBUF, policies=DRYRUN),
    create("cbor-create", body=lambda ns, name: b.cbor(b.cm(name, bogusField="x")), ctype=b.CBOR),
    create("json-charset", ctype="application/json; charset=utf-8"),
    create("json-upper-media-type", ctype="APPLICATION/JSON"),
    create("no-content-type", ctype=None),
    create("json-space-before-params", ctype="application/json ; charset=utf-8"),
    create("json-other-param", ctype="application/json;foo=bar"),
    create("yaml-upper-charset", body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n",
           ctype="Application/YAML; charset=UTF-8"),
    create("content-encoding-gzip-plain-body", headers=(("Content-Encoding", "gzip"),)),
    create("content-encoding-identity", headers=(("Content-Encoding", "identity"),)),
    create("content-encoding-gzip", headers=(("Content-Encoding", "gzip"),),
           body=lambda ns, name: gzip.compress(_unknown(ns, name))),
    create("text-plain", ctype="text/plain"),
    create("apply-yaml-create", "/api/v1/namespaces/{ns}/configmaps/{name}?fieldManager=adv", method="PATCH",
           ctype=b.APPLY_YAML, body=lambda ns, name: b.cm_yaml(name) + b"bogusField: x\n"),
    create("apply-cbor-create", "/api/v1/namespaces/{ns}/configmaps/{name}?fieldManager=adv", method="PATCH",
           ctype=b.APPLY_CBOR, body=lambda ns, name: b.cbor(b.cm(name, bogusField="x"))),
    modify("strategic-patch", "PATCH", ctype=b.STRATEGIC),
    modify("json-patch", "PATCH", ctype=b.JSON_PATCH, body=_const(
        b'[{"op":"add","path":"/data/k","value":"changed"},{"op":"add","path":"/bogusField","value":"x"}]')),
    modify("apply-yaml-seed", "PATCH", SEED + "?fieldManager=adv&force=true", ctype=b.APPLY_YAML,
           body=_const(b"apiVersion: v1\nkind: ConfigMap\ndata:\n  k: changed\nbogusField: x\n")),
    delete("delete-json-empty", body=_const(b"{}")),
    delete("delete-json-null", body=_const(b"null")),
    delete("delete-json-dryrun-empty", body=_const(b'{"dryRun":[]}')),
    delete("delete-json-dryrun-bogus", body=_const(b'{"dryRun":["None"]}')),
    delete("delete-query-dryrun-body-none", SEED + "?dryRun=All", body=_const(b'{"kind":"DeleteOptions"}')),
    delete("delete-json-duplicate-dryrun", body=_const(b'{"dryRun":["All"],"dryRun":[]}')),
    delete("delete-yaml", body=_const(b"kind: DeleteOptions\napiVersion: v1\n"), ctype=b.YAML),
    delete("delete-protobuf", body=_const(b.delete_options_protobuf()), ctype=b.PROTOBUF),
    delete("delete-cbor", body=_const(b.cbor({"kind": "DeleteOptions", "apiVersion": "v1"})), ctype=b.CBOR),
    delete("delete-body-text-plain", body=_const(b"{}"), ctype="text/plain"),
    delete("delete-chunked", body=_const(b"2\r\n{}\r\n0\r\n\r\n"), headers=(("Transfer-Encoding", "chunked"),)),
    # --- hostile bodies -------------------------------------------------------------------------------
    create("invalid-utf8-json", body=lambda ns, name: b.invalid_utf8_json(name)[:-1] + b',"bogusField":"x"}'),
    create("huge-number", body=lambda ns, name: b.huge_number_json(name)[:-1] + b',"bogusField":"x"}'),
    create("duplicate-keys", body=lambda ns, name: b.duplicate_keys_json(name)),
    create("json-depth-1000", body=lambda ns, name: b.json_depth_bomb(1000).replace(b'"deep"', f'"{name}"'.encode())),
    delete("delete-yaml-depth-1000", body=_const(b.yaml_depth_bomb(1000)), ctype=b.YAML),
    delete("delete-yaml-small-aliases", body=_const(b.yaml_alias_bomb(3, 3)), ctype=b.YAML),
    create("create-yaml-small-aliases", body=lambda ns, name: b.yaml_alias_bomb_cm(name, 3, 3), ctype=b.YAML),
]
