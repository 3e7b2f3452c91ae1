"""``credentials: impersonate``: kproxy authenticates each caller itself and calls the upstream
with its own credentials plus ``Impersonate-*`` headers naming the caller.

This is for a gateway whose callers' credentials cannot be forwarded (client certificates from
another CA, tokens the gateway must not pass on). The apiserver then authorizes every request as
the caller, so RBAC, audit and field managers see the caller, not kproxy.

Authentication follows the apiserver's own order (x509 first, then bearer tokens, then
anonymous; ``pkg/kubeapiserver/authenticator/config.go``):

- a client certificate verified against ``tls.client_ca_file`` during the handshake: the user
  is its Common Name, the groups its Organizations (the x509 authenticator's ``CommonNameUserConversion``);
- else a bearer token (``Authorization``, or a WebSocket request's bearer protocol, as the apiserver
  finds them: ``kproxy.identity.authn.caller_tokens``), through a TokenReview (cached briefly, see
  ``impersonate.token_cache_ttl``); a token the apiserver rejects gets the apiserver's own ``401``;
- else the anonymous user, impersonated as such (the apiserver gives it exactly the anonymous
  user's rights). The apiserver would take an impersonation of ``system:anonymous`` from kproxy
  even with its own anonymous auth off, so ``upstream.anonymous_auth: false`` (the operator says
  it is off) makes such a caller the apiserver's ``401`` instead.

Some identities are the control plane's own, and an impersonation naming one is worth more than
any RBAC grant: kproxy refuses to act as them unless the operator lists them
(``impersonate.allowed_privileged_groups`` / ``allowed_privileged_users``), whichever way the
caller authenticated. The caller gets ``403 Forbidden`` before any filter runs, and nothing is
written upstream (:class:`PrivilegedIdentity`). The refused names (``PRIVILEGED_GROUPS``,
``PRIVILEGED_USERS``, ``PRIVILEGED_USER_PREFIXES``; staging/src/k8s.io/apiserver/pkg/
authentication/user/user.go names them):

- group ``system:masters`` (``user.SystemPrivilegedGroup``): the apiserver's first authorizer
  allows it everything, before RBAC or any webhook is asked (pkg/kubeapiserver/authorizer/
  config.go, ``authorizerfactory.NewPrivilegedGroups``); no RBAC rule can restrict it;
- group ``system:nodes`` and users ``system:node:<name>`` (``user.NodesGroup``): the Node
  authorizer (plugin/pkg/auth/authorizer/node/node_authorizer.go) gives such a caller the
  secrets, config maps and service-account tokens of every pod bound to that node, and node
  status writes;
- users ``system:kube-controller-manager`` and ``system:kube-scheduler``: the bootstrap policy's
  roles for them (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go) read every secret
  and mint tokens for any service account (controller manager), bind any pod to any node
  (scheduler);
- the service accounts of ``kube-system`` (users ``system:serviceaccount:kube-system:<name>``,
  group ``system:serviceaccounts:kube-system``): the controller manager's powers, split by
  controller (bootstrappolicy/controller_policy.go; the garbage collector's role reads and
  deletes every resource, Secrets included). RBAC takes a user of that name for the service
  account, so a certificate naming one would otherwise carry its rights;
- user ``system:apiserver`` (``user.APIServerUser``): the apiserver's own loopback identity;
- group ``kubeadm:cluster-admins``: kubeadm (v1.29 and later) binds it to ``cluster-admin``
  (cmd/kubeadm/app/phases/kubeconfig/kubeconfig.go, ``EnsureAdminClusterRoleBinding``) and puts
  its administrators' kubeconfig in it;
- groups ``system:bootstrappers`` and ``system:bootstrappers:<name>``: kubeadm's bootstrap
  tokens; its bindings let them create node certificate signing requests that the controller
  manager approves (pkg/controller/certificates/approver/sarapprove.go), which makes a
  ``system:node:<name>`` certificate.

Names are compared exactly, as the authorizers compare them.

A cluster can make any other name as powerful (a group ``ops-admins`` bound to ``cluster-admin``),
or one request from it. So before acting as an identity kproxy also asks the apiserver, with
SubjectAccessReviews for that identity (user, groups, uid, extra), whether it may do everything
(verb, API group and resource ``*``: ``cluster-admin``'s rule) or any of the steps that make an
identity so (:data:`ADMIN_QUESTIONS`), and refuses it the same way unless the operator lists its
user or one of its groups (:class:`AdminCheck`). An allow is cached for
``impersonate.token_cache_ttl``, as token reviews are, a "no" for at most :data:`NOT_ADMIN_TTL`;
if the apiserver gives no answer kproxy does not act as the caller (the outage answer, or a 500).

Any ``Impersonate-*`` header the caller sent is removed (kproxy's own impersonation must be the
only one; the caller is told in a ``Warning``).

An identity is only worth impersonating if the apiserver reads back exactly the strings kproxy
authenticated. The apiserver would take a certificate whose Common Name is
``eve\r\nImpersonate-Group: system:masters`` as a user of that literal name; no header can carry
it (Go's ``Transport`` refuses such a value, its server refuses to read one, and written raw it
is a second header). Nor can a header carry a name with leading or trailing white space (Go's
reader trims it: ``" alice"`` would arrive as ``alice``), or an empty user name (no
``Impersonate-User`` means no impersonation at all). kproxy never sends such an identity: the
caller gets ``401 Unauthorized`` (kproxy, the authenticator here, cannot authenticate the caller
as anyone the apiserver would recognise; nothing reaches a filter or the apiserver), see
``UnrepresentableIdentity``. Extra keys are escaped as client-go escapes them
(``headerKeyEscape``); the apiserver lower-cases them, as it does for client-go's own
impersonation and the aggregator's ``X-Remote-Extra-`` headers.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import aiohttp
from multidict import CIMultiDict

from kproxy.core.chain import Exchange, Identity
from kproxy.core.context import FilterContext
from kproxy.core.outage import NoAnswer, upstream_failed
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import StatusError, forbidden, internal_error, unauthorized
from kproxy.gocompat.httpguts import TOKEN_CHARS, survives_trimming, valid_header_field_value
from kproxy.identity.access import AccessReviewer, AccessReviewError, api_review
from kproxy.identity.authn import SERVICE_KEY, Authenticator, TokenReviewError, without_token_protocol
from kproxy.identity.certname import certificate_subject

AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS_USER = "system:anonymous"
#: ``user.CredentialIDKey`` (staging/src/k8s.io/apiserver/pkg/authentication/user/user.go).
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
# Attribute types (OIDs, as tuples): commonName, organizationName (src/crypto/x509/pkix/pkix.go
# FillFromRDNSequence), and the Kubernetes user uid (k8s.io/apimachinery/pkg/apis/asn1/oid.go).
_OID_CN = (2, 5, 4, 3)
_OID_O = (2, 5, 4, 10)
_OID_UID = (1, 3, 6, 1, 4, 1, 57683, 2)
STRIPPED_WARNING = (
    '299 - "kproxy (credentials: impersonate) removed the Impersonate-* headers of this request: '
    'it acts as the caller it authenticated"'
)

# client-go's transport.headerKeyEscape (round_trippers.go): bytes of legalHeaderKeyBytes (net/http's
# token table) pass, every other byte and '%' is percent-encoded; the apiserver undoes it with
# url.PathUnescape.
_KEY_BYTES = frozenset(ord(c) for c in TOKEN_CHARS) - {ord("%")}


#: Identities kproxy does not impersonate unless the operator lists them (module docstring).
PRIVILEGED_GROUPS = (
    "system:masters",
    "system:nodes",
    "system:serviceaccounts:kube-system",
    # kubeadm (v1.29 and later) puts its administrators' kubeconfig in this group and binds it to
    # cluster-admin (cmd/kubeadm/app/phases/kubeconfig/kubeconfig.go, EnsureAdminClusterRoleBinding):
    # refused without a round trip, and even where the binding is made later than a review saw.
    "kubeadm:cluster-admins",
    # kubeadm's bootstrap tokens authenticate in this group (and system:bootstrappers:<groups>):
    # its bindings let them create node CSRs the controller manager auto-approves
    # (cmd/kubeadm/app/phases/bootstraptoken/node/tlsbootstrap.go, pkg/controller/certificates/
    # approver/sarapprove.go), i.e. mint a system:node:<name> certificate.
    "system:bootstrappers",
)
#: Group prefixes refused as the groups above (``system:bootstrappers:<extra group>``).
PRIVILEGED_GROUP_PREFIXES = ("system:bootstrappers:",)
PRIVILEGED_USERS = ("system:apiserver", "system:kube-controller-manager", "system:kube-scheduler")
PRIVILEGED_USER_PREFIXES = ("system:node:", "system:serviceaccount:kube-system:")


class PrivilegedAllowance(Protocol):
    """The operator's exceptions (``impersonate:`` in the config)."""

    @property
    def allowed_privileged_groups(self) -> Sequence[str]: ...

    @property
    def allowed_privileged_users(self) -> Sequence[str]: ...


class _NoneAllowed:
    allowed_privileged_groups: Sequence[str] = ()
    allowed_privileged_users: Sequence[str] = ()


class PrivilegedIdentity(Exception):
    """The caller is (or is in) a privileged identity the operator did not allow."""

    def __init__(self, resource: str, name: str, key: str) -> None:
        super().__init__(name)
        self.resource, self.name, self.key = resource, name, key

    def status(self) -> StatusError:
        """``403 Forbidden``, shaped as the apiserver's refusal of an impersonation
        (``NewForbidden`` on ``groups``/``users`` with the name)."""
        what = "group" if self.resource == "groups" else "user"
        return forbidden(
            "",
            self.resource,
            self.name,
            f'kproxy does not act as the privileged {what} "{self.name}" unless impersonate.{self.key} lists it',
        )


class ClusterAdmin(PrivilegedIdentity):
    """The apiserver allows the caller everything, or one step from it (``question``, see
    :data:`ADMIN_QUESTIONS`), and the operator did not list it."""

    def __init__(self, resource: str, name: str, key: str, question: str = "* *") -> None:
        super().__init__(resource, name, key)
        self.question = question

    def status(self) -> StatusError:
        return forbidden(
            "",
            self.resource,
            self.name,
            f'kproxy does not act as "{self.name}", whom the apiserver allows everything (cluster-admin) '
            f"or what makes an identity so (here: {self.question}), "
            "unless impersonate.allowed_privileged_users lists it or allowed_privileged_groups one of its groups",
        )


def check_privileged(identity: Identity, allowance: PrivilegedAllowance) -> None:
    """Raise :class:`PrivilegedIdentity` if ``identity`` names a privileged user or group that
    ``allowance`` does not list."""
    users = allowance.allowed_privileged_users
    if identity.user not in users and (
        identity.user in PRIVILEGED_USERS or identity.user.startswith(PRIVILEGED_USER_PREFIXES)
    ):
        raise PrivilegedIdentity("users", identity.user, "allowed_privileged_users")
    groups = allowance.allowed_privileged_groups
    for group in identity.groups:
        if (group in PRIVILEGED_GROUPS or group.startswith(PRIVILEGED_GROUP_PREFIXES)) and group not in groups:
            raise PrivilegedIdentity("groups", group, "allowed_privileged_groups")


def listed(identity: Identity, allowance: PrivilegedAllowance) -> bool:
    """Whether the operator listed ``identity`` (its user, or one of its groups) as one kproxy may
    act as whatever it may do."""
    return identity.user in allowance.allowed_privileged_users or any(
        g in allowance.allowed_privileged_groups for g in identity.groups
    )


def _ask(
    verb: str, group: str, resource: str, subresource: str = "", namespace: str = "", name: str = ""
) -> RequestInfo:
    return RequestInfo(
        path="",
        verb=verb,
        is_resource_request=True,
        api_group=group,
        api_version="*",
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=name,
    )


_RBAC = "rbac.authorization.k8s.io"
#: Cluster-admin's own rule: ``*`` verbs on ``*`` resources of ``*`` groups, every namespace.
EVERYTHING = _ask("*", "*", "*")
#: The questions :class:`AdminCheck` asks; an identity the apiserver allows ANY of is one kproxy
#: does not act as unless listed. One question is not enough: RBAC matches a requested ``*`` only
#: against a rule's literal ``*`` (plugin/pkg/auth/authorizer/rbac/rbac.go ``VerbMatches``,
#: ``ResourceMatches``), so a role listing every verb by name is cluster-admin and still says "no"
#: to :data:`EVERYTHING`. Each question below is cluster-admin or one request from it:
#:
#: - ``create``/``update``/``patch``/``delete`` on every resource of every group: write access to
#:   everything (RBAC objects included) is cluster-admin's power however the verbs are spelled;
#: - ``escalate`` and ``bind`` on ClusterRoles, ``create`` on ClusterRoleBindings: the RBAC storage
#:   lets ``escalate`` write a role with rules its author lacks, and ``bind`` bind one
#:   (pkg/registry/rbac/escalation_check.go ``EscalationAllowed``, ``BindingAuthorized``), so such
#:   an identity widens its own role, or binds ``cluster-admin`` to itself. ``create`` on
#:   ClusterRoleBindings is asked on its own: ``bind`` limited to ``resourceNames: [cluster-admin]``
#:   passes no nameless question (RBAC's ``ResourceNameMatches``), while a create has no name;
#: - ``impersonate`` on users, groups and service accounts: it acts as ``system:masters`` directly
#:   (kproxy strips the caller's ``Impersonate-*`` headers, but the identity is the apiserver's too);
#: - in ``kube-system``: ``create`` on ``serviceaccounts/token``, ``get`` on Secrets, ``create`` on
#:   Pods (a pod may run as any service account of its namespace), and ``*`` on ``*``: each gives the
#:   tokens of the controllers' service accounts, which the bootstrap policy binds to cluster-wide
#:   roles (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/controller_policy.go;
#:   ``clusterrole-aggregation-controller`` may ``escalate`` every ClusterRole) and which kproxy
#:   itself refuses to act as (``PRIVILEGED_USER_PREFIXES``).
#:
#: - ``approve`` on the ``kubernetes.io/kube-apiserver-client`` signer: it approves a client
#:   certificate request with any subject but ``O=system:masters`` (refused by the
#:   CertificateSubjectRestriction admission, plugin/pkg/admission/certificates/subjectrestriction),
#:   ``O=kubeadm:cluster-admins`` included;
#: - ``create`` on mutating webhook configurations and mutating admission policies: they rewrite
#:   any object the apiserver admits, a pod's service account and command included;
#: - ``get`` on ``nodes/proxy`` (the kubelet's API: exec in any pod of a node, its WebSocket form
#:   authorized as ``get``) and ``create`` on ``pods/exec`` in kube-system (the control plane's own
#:   pods).
#:
#: None of them is what an ordinary caller holds: the bootstrap roles ``edit``/``admin`` bound in
#: the caller's own namespace are not asked about (cluster-wide questions see cluster-wide
#: bindings only, and kube-system's bindings are the control plane's).
ADMIN_QUESTIONS: tuple[RequestInfo, ...] = (
    EVERYTHING,
    *(_ask(verb, "*", "*") for verb in ("create", "update", "patch", "delete")),
    _ask("escalate", _RBAC, "clusterroles"),
    _ask("bind", _RBAC, "clusterroles"),
    _ask("create", _RBAC, "clusterrolebindings"),
    *(_ask("impersonate", "", resource) for resource in ("users", "groups", "serviceaccounts")),
    _ask("create", "", "serviceaccounts", "token", namespace="kube-system"),
    _ask("get", "", "secrets", namespace="kube-system"),
    _ask("create", "", "pods", namespace="kube-system"),
    _ask("*", "*", "*", namespace="kube-system"),
    _ask("approve", "certificates.k8s.io", "signers", name="kubernetes.io/kube-apiserver-client"),
    _ask("create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    _ask("create", "admissionregistration.k8s.io", "mutatingadmissionpolicies"),
    _ask("get", "", "nodes", "proxy"),
    _ask("create", "", "pods", "exec", namespace="kube-system"),
)
#: How long a "not an administrator" answer is reused at most (seconds): the window in which an
#: identity made an administrator later (a binding created by someone else) is still acted as.
NOT_ADMIN_TTL = 5.0


def _question(info: RequestInfo) -> str:
    what = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    if info.api_group:
        what = f"{what}.{info.api_group}"
    where = f" in namespace {info.namespace}" if info.namespace else ""
    return f"{info.verb} {what}{where}"


class AdminCheck:
    """Whether the apiserver allows an identity everything or one step from it
    (:data:`ADMIN_QUESTIONS`), asked with SubjectAccessReviews for that identity (user, groups,
    uid, extra), concurrently, and cached (:class:`kproxy.identity.access.AccessReviewer`): an
    allow for ``ttl``, a denial for ``min(ttl, NOT_ADMIN_TTL)``.

    The static lists name the control plane's own identities; a cluster can make any other name
    as powerful (kubeadm's ``kubeadm:cluster-admins``, an operator's ``ops-admins`` bound to
    cluster-admin). The review runs the apiserver's whole authorizer chain, so whatever makes
    the identity an administrator (``system:masters``, RBAC under any name, a webhook) counts.
    """

    def __init__(self, ctx: FilterContext, ttl: float) -> None:
        self.reviewer = AccessReviewer(api_review(ctx), allow_ttl=ttl, deny_ttl=min(ttl, NOT_ADMIN_TTL))

    async def check(self, identity: Identity, allowance: PrivilegedAllowance) -> None:
        """Raise :class:`PrivilegedIdentity` if the apiserver allows ``identity`` any of
        :data:`ADMIN_QUESTIONS` and the operator did not list it; :class:`AccessReviewError` when
        the apiserver gave no decision for a question and allowed none of the others."""
        if listed(identity, allowance):
            return
        answers = await asyncio.gather(
            *(self.reviewer.check(identity, info) for info in ADMIN_QUESTIONS), return_exceptions=True
        )
        error: BaseException | None = None
        for info, answer in zip(ADMIN_QUESTIONS, answers, strict=True):
            if isinstance(answer, BaseException):
                error = error or answer
            elif answer.allowed:
                raise ClusterAdmin("users", identity.user, "allowed_privileged_users", _question(info))
        if error is not None:
            raise error


class UnrepresentableIdentity(ValueError):
    """An identity no ``Impersonate-*`` header can name exactly (see the module docstring).

    The text names the field, never its value (which the caller knows, and a log need not)."""

    def status(self) -> StatusError:
        """The caller's answer: ``401 Unauthorized``, saying why."""
        return unauthorized(f"Unauthorized: kproxy cannot impersonate this caller: {self}")


def escape_extra_key(key: str) -> str:
    try:
        raw = key.encode()
    except UnicodeEncodeError:
        raise UnrepresentableIdentity("an extra key is not UTF-8") from None
    return "".join(chr(b) if b in _KEY_BYTES else f"%{b:02X}" for b in raw)


def _representable(value: str, what: str) -> str:
    """``value`` if a header carries it to the apiserver unchanged; else UnrepresentableIdentity."""
    if not valid_header_field_value(value):
        raise UnrepresentableIdentity(f"{what} has a control byte (CR, LF, NUL, ...) no HTTP header can carry")
    if not survives_trimming(value):
        raise UnrepresentableIdentity(f"{what} begins or ends with white space, which HTTP headers drop")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise UnrepresentableIdentity(f"{what} is not UTF-8") from None
    return value


def impersonation_headers(identity: Identity) -> list[tuple[str, str]]:
    """The ``Impersonate-*`` headers that make the apiserver act as exactly ``identity``.

    Raises :class:`UnrepresentableIdentity` for an identity they cannot name exactly."""
    if not identity.user:
        raise UnrepresentableIdentity("the user name is empty")
    if identity.user == ANONYMOUS_USER and UNAUTHENTICATED not in identity.groups:
        # The impersonation filter adds system:unauthenticated to an impersonated system:anonymous
        # (staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation/mode.go): no header
        # can name this user without that group's rights.
        raise UnrepresentableIdentity("the user system:anonymous without the group system:unauthenticated")
    out = [("Impersonate-User", _representable(identity.user, "the user name"))]
    if identity.uid:
        out.append(("Impersonate-Uid", _representable(identity.uid, "the uid")))
    out += [("Impersonate-Group", _representable(g, f"group {i + 1}")) for i, g in enumerate(identity.groups)]
    for key, values in identity.extra.items():
        name = "Impersonate-Extra-" + escape_extra_key(key)
        out += [(name, _representable(v, f"a value of extra {name[len('Impersonate-Extra-') :]}")) for v in values]
    return out


def has_impersonation(headers: Mapping[str, str]) -> bool:
    return any(k.lower().startswith("impersonate-") for k in headers)


def strip_impersonation(headers: CIMultiDict[str]) -> None:
    """Remove every ``Impersonate-*`` header."""
    for name in {k for k in headers if k.lower().startswith("impersonate-")}:
        headers.popall(name)


def identity_from_peercert(peercert: Any) -> Identity | None:
    """The apiserver's x509 user for a verified client certificate: its DER (``ssl``
    ``getpeercert(binary_form=True)``, :func:`identity_from_certificate`), or the decoded form
    ``getpeercert()`` gives (user and groups only)."""
    if not peercert:
        return None
    if isinstance(peercert, (bytes, bytearray)):
        return identity_from_certificate(bytes(peercert))
    user = ""
    groups: list[str] = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    if not user:
        return None  # the x509 authenticator refuses a certificate without a Common Name
    return Identity(user=user, groups=authenticated_groups(user, groups))


def authenticated_groups(user: str, groups: Sequence[str]) -> tuple[str, ...]:
    """The groups after the apiserver's ``AuthenticatedGroupAdder`` (staging/src/k8s.io/apiserver/
    pkg/authentication/group/authenticated_group_adder.go): ``system:authenticated`` appended
    unless the user is ``system:anonymous`` or a group is ``system:authenticated`` or
    ``system:unauthenticated``."""
    if user == ANONYMOUS_USER or AUTHENTICATED in groups or UNAUTHENTICATED in groups:
        return tuple(groups)
    return (*groups, AUTHENTICATED)


def identity_from_certificate(der: bytes) -> Identity | None:
    """The x509 authenticator's user for a verified certificate (``CommonNameUserConversion``,
    staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go), then the
    ``AuthenticatedGroupAdder``: the user the subject's last Common Name, the groups its
    Organizations in order, the uid its one ``1.3.6.1.4.1.57683.2`` attribute (the
    ``AllowParsingUserUIDFromCertAuth`` feature, on by default), the extra
    ``authentication.kubernetes.io/credential-id: X509SHA256=<hex SHA-256 of the DER>``. None
    without a Common Name (the authenticator names no one). Raises :class:`UnrepresentableIdentity`
    where the apiserver never gets that far: a name Go's parser refuses (its TLS handshake fails,
    src/crypto/x509/parser.go ``parseName``), two uids or an empty one (x509.go ``parseUIDFromCert``)."""
    try:
        subject = certificate_subject(der)
    except ValueError as err:
        raise UnrepresentableIdentity(f"Go cannot read the certificate: {err}") from None
    user = ""
    groups: list[str] = []
    uids: list[str] = []
    for oid, value in subject:
        if oid == _OID_CN:
            user = value
        elif oid == _OID_O:
            groups.append(value)
        elif oid == _OID_UID:
            uids.append(value)
    if not user:
        return None
    if len(uids) > 1:
        raise UnrepresentableIdentity("the certificate names more than one uid")
    if uids and not uids[0]:
        raise UnrepresentableIdentity("the certificate's uid is empty")
    return Identity(
        user=user,
        groups=authenticated_groups(user, groups),
        uid=uids[0] if uids else "",
        extra={CREDENTIAL_ID: ("X509SHA256=" + hashlib.sha256(der).hexdigest(),)},
    )


class CallerAuthenticator:
    """Establishes ``ex.identity`` for every request in impersonate mode (before the chain runs)."""

    def __init__(
        self,
        ctx: FilterContext,
        token_ttl: float,
        rejected_ttl: float,
        allowance: Callable[[], PrivilegedAllowance] = _NoneAllowed,
    ) -> None:
        # Shared with the policy filters, which then see the same identity without another review.
        self.tokens = Authenticator(ctx, success_ttl=token_ttl, failure_ttl=rejected_ttl)
        ctx.provide(SERVICE_KEY, self.tokens)
        # Asked on every request, so a reload that removes an allowance applies at once.
        self.allowance = allowance
        # Whether an identity is a cluster administrator, asked before acting as it, cached as tokens are.
        self.admins = AdminCheck(ctx, token_ttl)

    async def identify(self, ex: Exchange, peercert: Any) -> Identity:
        """Set ``ex.identity``; raise the apiserver's 401 for a rejected token, a 401 for an identity
        kproxy cannot name in headers (``UnrepresentableIdentity``); if the apiserver cannot be
        reached, the outage answer (``kproxy.core.outage``), and a 500 if it answered the review
        with an error (kproxy never guesses an identity)."""
        try:
            identity = identity_from_peercert(peercert)
        except UnrepresentableIdentity as err:
            raise err.status() from None
        if identity is None:
            try:
                identity, by_protocol = await self.tokens.authenticate_request(ex.headers, source=_source(ex))
            except TokenReviewError as err:
                if isinstance(err.__cause__, (aiohttp.ClientConnectionError, OSError, TimeoutError)):
                    # The apiserver could not be asked: an outage, answered as one (kproxy.core.outage).
                    raise _outage(ex, err) from err
                raise internal_error(f"kproxy could not establish the caller's identity: {err}") from err
            if by_protocol:
                # As the apiserver does: the upstream's WebSocket handshake never sees the token.
                without_token_protocol(ex.headers)
        try:
            impersonation_headers(identity)
        except UnrepresentableIdentity as err:
            raise err.status() from None
        allowance = self.allowance()
        try:
            check_privileged(identity, allowance)
            await self.admins.check(identity, allowance)
        except PrivilegedIdentity as err:
            raise err.status() from None
        except AccessReviewError as err:
            if isinstance(err.__cause__, (aiohttp.ClientConnectionError, OSError, TimeoutError)):
                raise upstream_failed(ex.method, str(err), sent=False) from err
            # kproxy never acts as an identity it could not check.
            raise internal_error(f"kproxy could not check the caller's privileges: {err}") from err
        ex.identity = identity
        return identity


def _source(ex: Exchange) -> str:
    """The client's address, which token reviews are bounded by (kproxy.identity.reviewlimit)."""
    return str(ex.client or "")


def _outage(ex: Exchange, err: TokenReviewError) -> StatusError | NoAnswer:
    """A caller whose token could not be reviewed because the apiserver is unreachable gets what
    a request that never reached the upstream gets: a 429 with ``Retry-After``."""
    return upstream_failed(ex.method, str(err), sent=False)
