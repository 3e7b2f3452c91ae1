"""Status error bodies must be byte-identical to what kube-apiserver writes.

Expected bodies are what a real kube-apiserver answered (watch errors, timeouts, dry-run and strict
validation failures, forbidden, apply conflicts) or are derived from the Go constructors in
staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go.
"""

from __future__ import annotations

import json
import pickle

import pytest

from kproxy.core import status
from kproxy.core.requestinfo import parse_request_info
from kproxy.core.status import CauseType, StatusCause, StatusDetails, StatusError, StatusReason

JSON_HEADERS = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}


def _forbidden(method: str, path: str, user: str = "alice", reason: str = "") -> StatusError:
    return status.forbidden_for_request(parse_request_info(method, path), user, reason)


BODY_CASES: list[tuple[str, StatusError, bytes]] = [
    (
        "403 namespaced list",
        _forbidden("GET", "/api/v1/namespaces/default/pods"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods is forbidden: '
        b'User \\"alice\\" cannot list resource \\"pods\\" in API group \\"\\" in the namespace \\"default\\"",'
        b'"reason":"Forbidden","details":{"kind":"pods"},"code":403}\n',
    ),
    (
        "403 named get",
        _forbidden("GET", "/api/v1/namespaces/default/pods/p"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"p\\" is forbidden: '
        b'User \\"alice\\" cannot get resource \\"pods\\" in API group \\"\\" in the namespace \\"default\\"",'
        b'"reason":"Forbidden","details":{"name":"p","kind":"pods"},"code":403}\n',
    ),
    (
        "403 grouped subresource",
        _forbidden("PUT", "/apis/apps/v1/namespaces/ns/deployments/web/scale", "bob"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \\"web\\" '
        b'is forbidden: User \\"bob\\" cannot update resource \\"deployments/scale\\" in API group \\"apps\\" in the '
        b'namespace \\"ns\\"","reason":"Forbidden","details":{"name":"web","group":"apps","kind":"deployments"},'
        b'"code":403}\n',
    ),
    (
        "403 cluster scope",
        _forbidden("GET", "/api/v1/nodes"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes is forbidden: '
        b'User \\"alice\\" cannot list resource \\"nodes\\" in API group \\"\\" at the cluster scope",'
        b'"reason":"Forbidden","details":{"kind":"nodes"},"code":403}\n',
    ),
    (
        "403 impersonation",
        status.forbidden(
            "",
            "users",
            "bob",
            'User "alice" cannot impersonate resource "users" in API group "" at the cluster scope',
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"users \\"bob\\" is '
        b'forbidden: User \\"alice\\" cannot impersonate resource \\"users\\" in API group \\"\\" at the cluster '
        b'scope","reason":"Forbidden","details":{"name":"bob","kind":"users"},"code":403}\n',
    ),
    (
        "403 non-resource path",
        _forbidden("GET", "/foo"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User '
        b'\\"alice\\" cannot get path \\"/foo\\"","reason":"Forbidden","details":{},"code":403}\n',
    ),
    (
        "403 authorizer reason appended",
        _forbidden("DELETE", "/api/v1/namespaces/kube-system", "dev", "denied by policy"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces '
        b'\\"kube-system\\" is forbidden: User \\"dev\\" cannot delete resource \\"namespaces\\" in API group '
        b'\\"\\" in the namespace \\"kube-system\\": denied by policy","reason":"Forbidden","details":'
        b'{"name":"kube-system","kind":"namespaces"},"code":403}\n',
    ),
    (
        "404 grouped",
        status.not_found("apps", "deployments", "web"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps '
        b'\\"web\\" not found","reason":"NotFound","details":{"name":"web","group":"apps","kind":"deployments"},'
        b'"code":404}\n',
    ),
    (
        "404 core",
        status.not_found("", "pods", "p"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"p\\" not found",'
        b'"reason":"NotFound","details":{"name":"p","kind":"pods"},"code":404}\n',
    ),
    (
        "404 router",
        status.generic_server_response(404),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not '
        b'find the requested resource","reason":"NotFound","details":{},"code":404}\n',
    ),
    (
        "422 dryRun",
        status.invalid(
            "CreateOptions",
            "meta.k8s.io",
            "",
            [
                StatusCause(
                    CauseType.FIELD_VALUE_NOT_SUPPORTED,
                    'Unsupported value: ["foo"]: supported values: "All"',
                    "dryRun",
                )
            ],
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"CreateOptions.meta.k8s.io '
        b'\\"\\" is invalid: dryRun: Unsupported value: [\\"foo\\"]: supported values: \\"All\\"","reason":'
        b'"Invalid","details":{"group":"meta.k8s.io","kind":"CreateOptions","causes":[{"reason":'
        b'"FieldValueNotSupported","message":"Unsupported value: [\\"foo\\"]: supported values: \\"All\\"",'
        b'"field":"dryRun"}]},"code":422}\n',
    ),
    (
        "422 several causes, deduplicated in the message only",
        status.invalid(
            "Deployment",
            "apps",
            "web",
            [
                StatusCause(
                    "FieldValueInvalid", "Invalid value: -1: must be greater than or equal to 0", "spec.replicas"
                ),
                StatusCause("FieldValueRequired", "Required value", "spec.selector"),
                StatusCause("FieldValueRequired", "Required value", "spec.selector"),
            ],
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Deployment.apps \\"web\\" '
        b"is invalid: [spec.replicas: Invalid value: -1: must be greater than or equal to 0, spec.selector: "
        b'Required value]","reason":"Invalid","details":{"name":"web","group":"apps","kind":"Deployment","causes":'
        b'[{"reason":"FieldValueInvalid","message":"Invalid value: -1: must be greater than or equal to 0",'
        b'"field":"spec.replicas"},{"reason":"FieldValueRequired","message":"Required value","field":'
        b'"spec.selector"},{"reason":"FieldValueRequired","message":"Required value","field":"spec.selector"}]},'
        b'"code":422}\n',
    ),
    (
        "422 strict PATCH (empty kind, message starts with a space)",
        status.invalid(
            "",
            "",
            "",
            [StatusCause("FieldValueInvalid", 'Invalid value: "{}": strict decoding error: unknown field', "patch")],
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":" \\"\\" is invalid: '
        b'patch: Invalid value: \\"{}\\": strict decoding error: unknown field","reason":"Invalid","details":'
        b'{"causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \\"{}\\": strict decoding error: '
        b'unknown field","field":"patch"}]},"code":422}\n',
    ),
    (
        "422 without causes",
        status.invalid("Pod", "", "p", []),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Pod \\"p\\" is invalid",'
        b'"reason":"Invalid","details":{"name":"p","kind":"Pod"},"code":422}\n',
    ),
    (
        "409 conflict (stale resourceVersion)",
        status.conflict("", "pods", "p"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be '
        b'fulfilled on pods \\"p\\": the object has been modified; please apply your changes to the latest '
        b'version and try again","reason":"Conflict","details":{"name":"p","kind":"pods"},"code":409}\n',
    ),
    (
        "409 already exists",
        status.already_exists("", "pods", "p"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"p\\" already '
        b'exists","reason":"AlreadyExists","details":{"name":"p","kind":"pods"},"code":409}\n',
    ),
    (
        "409 apply conflict",
        status.apply_conflict(
            [
                StatusCause(
                    CauseType.FIELD_MANAGER_CONFLICT,
                    'conflict with "kubectl-client-side-apply" using apps/v1',
                    ".spec.replicas",
                )
            ],
            'Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.replicas',
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Apply failed with 1 '
        b'conflict: conflict with \\"kubectl-client-side-apply\\" using apps/v1: .spec.replicas","reason":'
        b'"Conflict","details":{"causes":[{"reason":"FieldManagerConflict","message":"conflict with '
        b'\\"kubectl-client-side-apply\\" using apps/v1","field":".spec.replicas"}]},"code":409}\n',
    ),
    (
        "410 expired",
        status.resource_expired("too old resource version: 1000 (1500)"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: '
        b'1000 (1500)","reason":"Expired","code":410}\n',
    ),
    (
        "410 expired continue carries a fresh token",
        status.resource_expired("The provided continue parameter is too old.", continue_token="eyJ2Ijoi"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{"continue":"eyJ2Ijoi"},"status":"Failure","message":'
        b'"The provided continue parameter is too old.","reason":"Expired","code":410}\n',
    ),
    (
        "410 gone",
        status.gone("gone"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"gone","reason":"Gone",'
        b'"code":410}\n',
    ),
    (
        "504 too large resource version",
        status.timeout(
            "Too large resource version: 5, current: 3",
            1,
            [StatusCause(CauseType.RESOURCE_VERSION_TOO_LARGE, "Too large resource version")],
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Timeout: Too large resource '
        b'version: 5, current: 3","reason":"Timeout","details":{"causes":[{"reason":"ResourceVersionTooLarge",'
        b'"message":"Too large resource version"}],"retryAfterSeconds":1},"code":504}\n',
    ),
    (
        "500 server timeout",
        status.server_timeout("", "pods", "list", 2),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The list operation against '
        b'pods could not be completed at this time, please try again.","reason":"ServerTimeout","details":'
        b'{"name":"list","kind":"pods","retryAfterSeconds":2},"code":500}\n',
    ),
    (
        "400 bad request",
        status.bad_request("<text>"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"\\u003ctext\\u003e",'
        b'"reason":"BadRequest","code":400}\n',
    ),
    (
        "401",
        status.unauthorized(),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":'
        b'"Unauthorized","code":401}\n',
    ),
    (
        "413 body limit",
        status.request_entity_too_large(3 * 1024 * 1024),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Request entity too large: '
        b'limit is 3145728","reason":"RequestEntityTooLarge","code":413}\n',
    ),
    (
        "406 handler",
        status.not_acceptable(["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"]),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the following media '
        b'types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf","reason":'
        b'"NotAcceptable","code":406}\n',
    ),
    (
        "406 router",
        status.generic_server_response(
            406,
            server_message="406: Not Acceptable\n\nAvailable representations: application/json",
        ),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"406: Not Acceptable\\n\\n'
        b'Available representations: application/json","reason":"NotAcceptable","details":{},"code":406}\n',
    ),
    (
        "415",
        status.unsupported_media_type(["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"]),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the body of the request '
        b"was in an unknown format - accepted media types include: application/json, application/yaml, "
        b'application/vnd.kubernetes.protobuf","reason":"UnsupportedMediaType","code":415}\n',
    ),
    (
        "429 storage initializing",
        status.too_many_requests("storage is (re)initializing", 1),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"storage is (re)initializing"'
        b',"reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}\n',
    ),
    (
        "429 without retry keeps an empty details object",
        status.too_many_requests("slow down"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"slow down","reason":'
        b'"TooManyRequests","details":{},"code":429}\n',
    ),
    (
        "503 shutting down",
        status.service_unavailable("apiserver is shutting down", retry_after=1),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"apiserver is shutting down",'
        b'"reason":"ServiceUnavailable","code":503}\n',
    ),
    (
        "500 internal error",
        status.internal_error(RuntimeError("etcd down")),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Internal error occurred: '
        b'etcd down","reason":"InternalError","details":{"causes":[{"message":"etcd down"}]},"code":500}\n',
    ),
    (
        "405 method not supported",
        status.method_not_supported("apps", "deployments", "deletecollection"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deletecollection is not '
        b'supported on resources of kind \\"deployments.apps\\"","reason":"MethodNotAllowed","details":'
        b'{"group":"apps","kind":"deployments"},"code":405}\n',
    ),
    (
        "generic with unknown reason omits the key",
        status.generic(500, StatusReason.UNKNOWN, "boom"),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"boom","code":500}\n',
    ),
    (
        "code 0 becomes 500 (ErrorToAPIStatus)",
        status.generic(0, "Custom", ""),
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","reason":"Custom","code":500}\n',
    ),
]


@pytest.mark.parametrize(("name", "err", "expected"), BODY_CASES, ids=[c[0] for c in BODY_CASES])
def test_body_bytes(name: str, err: StatusError, expected: bytes) -> None:
    assert err.body() == expected


def test_key_order() -> None:
    err = status.StatusError(
        422,
        StatusReason.INVALID,
        "m",
        StatusDetails(
            name="n",
            group="g",
            kind="K",
            uid="u",
            causes=(StatusCause("r", "m", "f"),),
            retry_after_seconds=3,
        ),
        continue_token="c",
    )
    doc = json.loads(err.body())
    assert list(doc) == ["kind", "apiVersion", "metadata", "status", "message", "reason", "details", "code"]
    assert list(doc["details"]) == ["name", "group", "kind", "uid", "causes", "retryAfterSeconds"]
    assert list(doc["details"]["causes"][0]) == ["reason", "message", "field"]
    assert doc["metadata"] == {"continue": "c"}
    assert list(err.to_dict()) == list(doc)


def test_empty_cause_fields_are_omitted() -> None:
    err = status.internal_error("x")
    assert json.loads(err.body())["details"] == {"causes": [{"message": "x"}]}
    assert StatusCause().to_dict() == {}
    assert StatusDetails().to_dict() == {}


def test_pretty_body_matches_marshal_indent() -> None:
    body = status.not_found("", "pods", "p<").body(pretty=True)
    assert body == (
        b"{\n"
        b'  "kind": "Status",\n'
        b'  "apiVersion": "v1",\n'
        b'  "metadata": {},\n'
        b'  "status": "Failure",\n'
        b'  "message": "pods \\"p\\u003c\\" not found",\n'
        b'  "reason": "NotFound",\n'
        b'  "details": {\n'
        b'    "name": "p\\u003c",\n'
        b'    "kind": "pods"\n'
        b"  },\n"
        b'  "code": 404\n'
        b"}"
    )


def test_go_json_escapes() -> None:
    err = status.bad_request("a<b>&c\u2028d\u2029e\x00\x08\x0c\x1f\x7f/é😀")
    assert err.body() == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":'
        b'"a\\u003cb\\u003e\\u0026c\\u2028d\\u2029e\\u0000\\b\\f\\u001f\x7f/\xc3\xa9\xf0\x9f\x98\x80",'
        b'"reason":"BadRequest","code":400}\n'
    )


def test_invalid_utf8_becomes_escaped_replacement_character() -> None:
    # a raw 0xff byte decoded with surrogateescape; Go writes invalid UTF-8 as the escape \ufffd
    bad = b"x\xffy".decode("utf-8", "surrogateescape")
    body = status.not_found("", "pods", bad).body()
    assert b'"message":"pods \\"x\\\\xffy\\" not found"' in body  # %q shows the byte as \xff
    assert b'"name":"x\\ufffdy"' in body
    # a genuine U+FFFD stays a raw character, and NULs next to it are still escaped normally
    body = status.bad_request("\x00\ufffd" + bad + "\x00").body()
    assert b'"message":"\\u0000\xef\xbf\xbdx\\ufffdy\\u0000"' in body


def test_html_sanitised_forbidden_message() -> None:
    err = _forbidden("GET", "/foo<bar>", user="a&b", reason="webhook <said> no")
    assert err.message == ('forbidden: User "a&amp;b" cannot get path "/foo&lt;bar&gt;": webhook <said> no')
    assert (
        b'"message":"forbidden: User \\"a\\u0026amp;b\\" cannot get path \\"/foo\\u0026lt;bar\\u0026gt;\\": '
        b'webhook \\u003csaid\\u003e no"' in err.body()
    )


def test_forbidden_message_text() -> None:
    info = parse_request_info("POST", "/api/v1/namespaces/ns/pods/p/exec")
    assert status.forbidden_message(info, "system:serviceaccount:ns:sa") == (
        'User "system:serviceaccount:ns:sa" cannot create resource "pods/exec" in API group "" in the namespace "ns"'
    )
    info = parse_request_info("GET", "/apis/apps/v1/deployments", {"watch": "1"})
    assert status.forbidden_message(info, "") == (
        'User "" cannot watch resource "deployments" in API group "apps" at the cluster scope'
    )
    info = parse_request_info("PATCH", "/metrics")
    assert status.forbidden_message(info, "bob") == 'User "bob" cannot patch path "/metrics"'


@pytest.mark.parametrize(
    ("err", "headers"),
    [
        (_forbidden("GET", "/api/v1/pods"), {**JSON_HEADERS, "X-Content-Type-Options": "nosniff"}),
        (status.forbidden("", "pods", "p", "admission said no"), JSON_HEADERS),
        (status.not_found("", "pods", "p"), JSON_HEADERS),
        (status.server_timeout("", "pods", "list", 2), {**JSON_HEADERS, "Retry-After": "2"}),
        (status.timeout("x", 1), {**JSON_HEADERS, "Retry-After": "1"}),
        (status.timeout("x"), JSON_HEADERS),
        (status.too_many_requests("x", 30), {**JSON_HEADERS, "Retry-After": "30"}),
        (status.service_unavailable("apiserver is shutting down", 1), {**JSON_HEADERS, "Retry-After": "1"}),
        (status.service_unavailable("down"), JSON_HEADERS),
    ],
)
def test_headers(err: StatusError, headers: dict[str, str]) -> None:
    assert err.headers() == headers


@pytest.mark.parametrize(
    ("err", "code", "reason"),
    [
        (status.bad_request("x"), 400, "BadRequest"),
        (status.unauthorized(""), 401, "Unauthorized"),
        (status.forbidden("", "", "", "x"), 403, "Forbidden"),
        (status.not_found("", "pods", "p"), 404, "NotFound"),
        (status.method_not_supported("", "pods", "x"), 405, "MethodNotAllowed"),
        (status.not_acceptable(["a"]), 406, "NotAcceptable"),
        (status.already_exists("", "pods", "p"), 409, "AlreadyExists"),
        (status.conflict("", "pods", "p"), 409, "Conflict"),
        (status.gone("x"), 410, "Gone"),
        (status.resource_expired("x"), 410, "Expired"),
        (status.request_entity_too_large(1), 413, "RequestEntityTooLarge"),
        (status.unsupported_media_type(["a"]), 415, "UnsupportedMediaType"),
        (status.invalid("K", "", "n", []), 422, "Invalid"),
        (status.too_many_requests("x"), 429, "TooManyRequests"),
        (status.internal_error("x"), 500, "InternalError"),
        (status.server_timeout("", "pods", "get", 0), 500, "ServerTimeout"),
        (status.service_unavailable("x"), 503, "ServiceUnavailable"),
        (status.timeout("x"), 504, "Timeout"),
    ],
)
def test_codes_and_reasons(err: StatusError, code: int, reason: str) -> None:
    assert (err.code, err.http_status, err.reason) == (code, code, reason)
    doc = json.loads(err.body())
    assert (doc["code"], doc["reason"], doc["status"]) == (code, reason, "Failure")


def test_forbidden_message_forms() -> None:
    assert status.forbidden("", "", "", "x").message == "forbidden: x"
    assert status.forbidden("apps", "", "", "x").message == ".apps is forbidden: x"
    assert status.forbidden("", "pods", "", "x").message == "pods is forbidden: x"
    assert status.forbidden("apps", "deployments", "d", ValueError("x")).message == (
        'deployments.apps "d" is forbidden: x'
    )
    assert status.unauthorized("").message == "not authorized"
    assert status.unauthorized().message == "Unauthorized"


def test_generic_server_response_variants() -> None:
    err = status.generic_server_response(409, "POST", "apps", "deployments", "web")
    assert (err.reason, err.message) == ("AlreadyExists", "the server reported a conflict (post deployments.apps web)")
    err = status.generic_server_response(409, "PUT", "", "pods")
    assert (err.reason, err.message) == ("Conflict", "the server reported a conflict (put pods)")
    err = status.generic_server_response(502, server_message='bad "gateway"', is_unexpected_response=True)
    assert err.reason == "InternalError"
    assert err.message == 'an error on the server ("bad \\"gateway\\"") has prevented the request from succeeding'
    assert err.details == StatusDetails(causes=(StatusCause("UnexpectedServerResponse", 'bad "gateway"'),))
    err = status.generic_server_response(418)
    assert (err.reason, err.message) == (
        "",
        "the server responded with the status code 418 but did not return more information",
    )
    err = status.generic_server_response(405)
    assert err.message == "the server does not allow this method on the requested resource"


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", '"plain"'),
        ("", '""'),
        ('a"b\\c', '"a\\"b\\\\c"'),
        ("tab\tnl\ncr\rbell\a\v\f\b", '"tab\\tnl\\ncr\\rbell\\a\\v\\f\\b"'),
        ("\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
        ("é日本😀", '"é日本😀"'),
        ("\u00a0\u200b\u2028", '"\\u00a0\\u200b\\u2028"'),
        ("\U000e0001", '"\\U000e0001"'),
        (b"\xff".decode("utf-8", "surrogateescape"), '"\\xff"'),
    ],
)
def test_go_quote(value: str, quoted: str) -> None:
    assert status.go_quote(value) == quoted


def test_status_error_behaves_like_an_exception() -> None:
    err = status.not_found("", "pods", "p")
    with pytest.raises(StatusError, match='pods "p" not found') as exc:
        raise err
    assert exc.value is err
    assert str(err) == 'pods "p" not found'
    assert err.args == ('pods "p" not found',)
    assert {err: 1}[err] == 1  # hashable by identity
    clone = pickle.loads(pickle.dumps(err))
    assert clone.body() == err.body()
