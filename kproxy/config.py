"""YAML config -> typed, validated settings.

Every error names the offending key (``filters[1].resources: ...``), at start-up, so a bad
config never reaches a running proxy. Filters validate their own settings: each filter class
carries a pydantic model, looked up by the entry's ``name:``.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from kproxy.gocompat.regexp import compile_go_regexp

DEFAULT_MAX_BODY = 3 * 1024 * 1024  # the apiserver's MaxRequestBodyBytes


class ConfigError(ValueError):
    """A config problem; the message names the key."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> Any:
    """``30``, ``"30s"``, ``"1.5m"``, ``"250ms"`` -> seconds as float. Others fail validation."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f'expected a duration such as "30s", "2m" or a number of seconds, got {value!r}')
        return float(m.group(1)) * _UNITS[m.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]


def split_hostport(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT`` -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenAddr(Strict):
    host: str
    port: int


def _listen(value: Any) -> Any:
    if isinstance(value, str):
        host, port = split_hostport(value)
        return {"host": host, "port": port}
    return value


Listen = Annotated[ListenAddr, BeforeValidator(_listen)]


class TLSConfig(Strict):
    """Serve HTTPS on the main listener."""

    cert_file: str
    key_file: str
    # Ask callers for a client certificate and verify it against this CA bundle
    # (credentials: impersonate only: a certificate identity cannot be forwarded).
    client_ca_file: str | None = None


class ImpersonateConfig(Strict):
    """``credentials: impersonate``: how long kproxy trusts a TokenReview of a caller's token."""

    token_cache_ttl: Duration = 10.0
    rejected_token_cache_ttl: Duration = 5.0
    # Callers kproxy refuses to act as unless listed here (kproxy/identity/impersonate.py,
    # PRIVILEGED_GROUPS, PRIVILEGED_USERS): a group system:masters, system:nodes or
    # system:serviceaccounts:kube-system, a user system:apiserver, system:kube-controller-manager,
    # system:kube-scheduler, system:node:* or system:serviceaccount:kube-system:*, a group
    # kubeadm:cluster-admins, system:bootstrappers or system:bootstrappers:*; and any identity the
    # apiserver allows everything or one request from it (cluster-admin, every write verb, escalate
    # or bind on ClusterRoles, impersonation, kube-system's tokens: impersonate.py ADMIN_QUESTIONS),
    # asked with SubjectAccessReviews. A user is listed by name; an identity one of whose groups is
    # listed is not asked about.
    allowed_privileged_groups: list[str] = []
    allowed_privileged_users: list[str] = []


class TokenReviewsConfig(Strict):
    """TokenReviews kproxy sends for callers' tokens (forward and impersonate modes), which the
    apiserver's priority and fairness charges to kproxy: bounded in total, shared round robin
    between per-client-address queues and bounded per address; a caller is answered 429 with
    Retry-After only when its own address's queue is full or it waited too long
    (kproxy/identity/reviewlimit.py)."""

    max_in_flight: int = Field(default=32, ge=1)
    max_in_flight_per_client: int = Field(default=4, ge=1)


def _go_regexp(value: str) -> str:
    compile_go_regexp(value)  # ValueError (naming what is not supported) fails the key
    return value


def _regexp_list(value: Any) -> Any:
    """A list, or one string split on commas as kubectl proxy splits its flag (``""`` is none)."""
    if isinstance(value, str):
        return value.split(",") if value else []
    return value


GoRegexps = Annotated[list[Annotated[str, AfterValidator(_go_regexp)]], BeforeValidator(_regexp_list)]


class ProxyConfig(Strict):
    """``credentials: proxy``: kubectl proxy's request filter, with its defaults and meaning
    (staging/src/k8s.io/kubectl/pkg/proxy/proxy_server.go ``FilterServer``; kproxy/server/proxyguard.py).
    Go regular expressions (the subset kproxy/gocompat/regexp.py supports), each tried anywhere
    in the string unless anchored. A request is refused with kubectl proxy's 403 unless its host
    matches an accept_hosts entry and its path an accept_paths entry, and neither its path
    matches a reject_paths entry nor its method a reject_methods entry."""

    # Go's req.Host, after net.SplitHostPort (the whole value when that fails).
    accept_hosts: GoRegexps = ["^localhost$", r"^127\.0\.0\.1$", r"^\[::1\]$"]
    # Go's req.URL.Path (percent-decoded).
    accept_paths: GoRegexps = ["^.*"]
    # exec and attach through the proxy's rights are an explicit opt-in: set [] to allow them.
    reject_paths: GoRegexps = ["^/api/.*/pods/.*/exec", "^/api/.*/pods/.*/attach"]
    reject_methods: GoRegexps = ["^$"]
    # kubectl proxy --disable-filter: no check at all.
    disable_filter: bool = False
    # Beyond kubectl proxy: a request with an Origin header (a browser's WebSocket or cross-site
    # request) is accepted only when the origin's host matches accept_hosts too; otherwise a page
    # on any site could open a WebSocket watch (of Secrets, say) through the user's credentials.
    # false = kubectl proxy's behaviour (Origin not looked at).
    check_origin: bool = True


class UpstreamConfig(Strict):
    kubeconfig: str | None = None
    context: str | None = None
    connect_timeout: Duration = 10.0
    # 0 = unlimited pooled connections to the upstream.
    max_connections: int = Field(default=0, ge=0)
    # Whether the apiserver takes a request without credentials as system:anonymous (its
    # --anonymous-auth, on by default). kproxy cannot send such a request in impersonate mode (it
    # would impersonate the anonymous user), nor ask about one for a cached read in forward mode,
    # so false makes kproxy answer callers without credentials with the apiserver's own 401.
    anonymous_auth: bool = True
    # HTTP/2 to the apiserver when it offers h2 by ALPN (as client-go): requests multiplexed on a
    # few connections (docs/using/configuration.md#to-the-apiserver). False, or an upstream that offers only HTTP/1.1,
    # keeps the HTTP/1.1 pool (upgrades are always HTTP/1.1).
    http2: bool = True


class ConnectionsConfig(Strict):
    """Client connections to the main listener: the apiserver's deadlines (its ``http.Server``:
    ReadHeaderTimeout 32s, IdleTimeout 90s) and kproxy's bounds on unfinished request heads.
    0 = no limit. See kproxy/server/connections.py."""

    # Time a client has to send a whole request head, from the connection's start (or from the
    # first four bytes of its next request); then the connection closes without an answer, as Go
    # closes it. Requests being served (watches, exec, slow bodies) have no deadline.
    read_header_timeout: Duration = 32.0
    # Time a kept-alive connection may wait for its next request before it is closed.
    idle_timeout: Duration = 90.0
    # Connections reading a head at once; beyond it the one reading longest is closed. (About
    # 6 KiB each, 48 KiB over TLS: docs/capacity.md.)
    max_unfinished_heads: int = Field(default=1024, ge=0)
    # Memory held by heads received and not yet served, all connections together (estimated:
    # the bytes plus about 150 per header line); beyond it the connection reading longest is closed.
    max_unfinished_head_bytes: int = Field(default=64 << 20, ge=0)
    # TLS handshakes in progress at once (each has read_header_timeout to finish, as Go's
    # tlsHandshakeTimeout); beyond it the one in progress longest is closed.
    max_tls_handshakes: int = Field(default=512, ge=0)
    # Kept-alive connections waiting for their next request; beyond it the one idle longest is
    # closed. (About 12 KiB each, 54 KiB over TLS.)
    max_idle_connections: int = Field(default=2048, ge=0)
    # All client connections. 0: derived from the file-descriptor limit (RLIMIT_NOFILE) with room
    # for upstream connections; a larger value is lowered to that. Beyond it a new connection takes
    # the place of the one waiting longest on its client, or is closed when all are being served.
    max_connections: int = Field(default=0, ge=0)
    # Connections from one source address (0: no bound); beyond it a new one is closed at once.
    # Leave it off where callers reach kproxy through a NAT or a load balancer that hides them.
    max_connections_per_source: int = Field(default=0, ge=0)


class Http2Config(Strict):
    """HTTP/2 on the TLS listener: ALPN offers ``h2`` then ``http/1.1``, as the apiserver does,
    and an h2 connection is served with the apiserver's settings (kproxy/server/http2/settings.py).
    A listener without TLS speaks HTTP/1.1 only (as Go's server without h2c)."""

    enabled: bool = True
    # Streams a client may have open on one connection (kube-apiserver's
    # --http2-max-streams-per-connection, 100 when unset). The connection's receive window is
    # this many times the 256 KiB stream window, as the apiserver sizes it.
    max_concurrent_streams: int = Field(default=100, ge=1, le=(1 << 31) - 1)


class BodiesConfig(Strict):
    """Request bodies: the time a caller has to send one, the memory bodies being read may hold,
    and the workers that decode the bodies kproxy checks, shared fairly between callers (a caller
    is its user when known, else its address). Past a bound: the apiserver's APF answer, 429 with
    Retry-After. 0 = no limit. See kproxy/core/fairness.py, kproxy/core/bodybudget.py and
    docs/performance.md (fair shares)."""

    # Time a caller has to send a whole body, from the request's start (the apiserver's request
    # timeout, --request-timeout, 60s; long-running requests such as exec and proxy have none):
    # then the apiserver's 504 Timeout, and the connection closes.
    read_timeout: Duration = 60.0
    # Bytes all bodies being read may hold (a declared Content-Length is taken at once).
    max_buffered_bytes: int = Field(default=64 << 20, ge=0)
    # Bytes one caller's bodies may hold, all its connections together.
    max_buffered_bytes_per_caller: int = Field(default=16 << 20, ge=0)
    # Time a body waits for bytes to be given back before its 429.
    buffer_wait: Duration = 1.0
    # Threads decoding bodies at once (bodies over 8 KiB; smaller ones are decoded in place).
    workers: int = Field(default=2, ge=1)
    # Decodes one caller runs at once; below workers, another caller always finds one free.
    workers_per_caller: int = Field(default=1, ge=1)
    # Decodes one caller may have waiting, and all callers together.
    queue_per_caller: int = Field(default=8, ge=0)
    queue_total: int = Field(default=128, ge=0)
    # Time a decode waits for a worker before its 429 (APF's: the request timeout / 4).
    queue_wait: Duration = 15.0
    # Bodies of this size and more take at most workers - 1 workers together (all callers), so a
    # smaller body never waits behind them.
    large_body_bytes: int = Field(default=256 << 10, ge=0)


class LogConfig(Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    access_log: bool = True


class FilterEntry(BaseModel):
    """One ``filters:`` entry: ``name`` plus that filter's own settings (validated by it)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Config(Strict):
    listen: Listen = ListenAddr(host="127.0.0.1", port=8001)
    admin_listen: Listen = ListenAddr(host="127.0.0.1", port=9099)
    # Who may read the admin listener's /metrics: "authorized" (a bearer token the apiserver
    # authenticates, allowed `get` on the non-resource URL /metrics, as for the apiserver's own
    # /metrics), "anyone", or "auto": authorized unless admin_listen is a loopback address.
    # The probes (/healthz, /livez, /readyz) are open to anyone, as the apiserver's are.
    metrics_access: Literal["auto", "authorized", "anyone"] = "auto"
    # Serve the admin listener over TLS with the certificate of `tls` (so scrapers' bearer
    # tokens do not cross the network in clear).
    admin_tls: bool = False
    # With credentials: proxy every caller gets the proxy's own rights, so a non-loopback
    # listener must be asked for explicitly (the kubectl proxy model).
    allow_remote: bool = False
    credentials: Literal["proxy", "forward", "impersonate"] = "proxy"
    impersonate: ImpersonateConfig = ImpersonateConfig()
    token_reviews: TokenReviewsConfig = TokenReviewsConfig()
    proxy: ProxyConfig = ProxyConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    tls: TLSConfig | None = None
    max_request_body_bytes: int = Field(default=DEFAULT_MAX_BODY, gt=0)
    shutdown_timeout: Duration = 30.0
    connections: ConnectionsConfig = ConnectionsConfig()
    http2: Http2Config = Http2Config()
    bodies: BodiesConfig = BodiesConfig()
    # How often the config file is checked for changes (hot reload); 0 = only on SIGHUP.
    reload_interval: Duration = 2.0
    log: LogConfig = LogConfig()
    filters: list[FilterEntry] = []

    @field_validator("filters")
    @classmethod
    def _unique_names(cls, v: list[FilterEntry]) -> list[FilterEntry]:
        seen: set[str] = set()
        for i, entry in enumerate(v):
            if entry.name in seen:
                raise ValueError(f"filters[{i}]: filter {entry.name!r} is listed twice")
            seen.add(entry.name)
        return v


def _loc(loc: tuple[int | str, ...], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _model_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the key at ``loc`` (for listing its known keys), if any."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _inner_model(field.annotation)
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if (found := _inner_model(arg)) is not None:
            return found
    return None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'credentials'?)`` for a near miss among ``known``, else ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


#: pydantic error types rewritten in the config's own words (the rest: "Input should be" -> "must be").
_MESSAGES = {
    "missing": "is required",
    "dict_type": "must be a mapping (key: value lines)",
    "list_type": "must be a list ([a, b] or - lines)",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
}


def _message(e: Mapping[str, Any], model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> str:
    kind = e["type"]
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        known = parent.model_fields if parent is not None else ()
        return "unknown key" + did_you_mean(str(loc[-1]), known)
    if kind == "model_type":
        target = _model_at(model, loc)
        if target is ListenAddr:
            return "must be HOST:PORT, e.g. 127.0.0.1:8001"
        keys = ", ".join(target.model_fields) if target is not None else ""
        return "must be a mapping" + (f" with the keys {keys}" if keys else "")
    if kind == "literal_error":
        expected = str(e.get("ctx", {}).get("expected", ""))
        got = e.get("input")
        options = re.findall(r"'([^']*)'", expected)
        hint = did_you_mean(got, options) if isinstance(got, str) else ""
        return f"must be one of {expected}, not {got!r}{hint}"
    if kind in _MESSAGES:
        return _MESSAGES[kind]
    msg = str(e["msg"])
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return msg.replace("Input should be", "must be")


def format_validation_error(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """Every error of ``err`` as ``key: what is wrong``, in the config's words, with near misses named."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        lines.append(f"{_loc(loc, prefix)}: {_message(e, model, loc)}")
    return "; ".join(lines)


def parse_config(data: Mapping[str, Any] | None) -> Config:
    """Validate a config mapping; raise ConfigError naming each bad key."""
    try:
        cfg = Config.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model=Config)) from None
    if cfg.credentials == "proxy" and not cfg.allow_remote and not is_loopback(cfg.listen.host):
        raise ConfigError(
            f"listen: {cfg.listen.host} is not a loopback address; with credentials: proxy every caller "
            "gets the proxy's own rights, so set allow_remote: true to listen there"
        )
    if cfg.credentials != "proxy" and cfg.proxy != ProxyConfig():
        raise ConfigError(
            "proxy: applies only with credentials: proxy (in the other modes each caller's own "
            "credentials reach the apiserver, so a request kproxy did not filter gains nothing of kproxy's)"
        )
    if cfg.tls is not None and cfg.tls.client_ca_file and cfg.credentials != "impersonate":
        raise ConfigError(
            "tls.client_ca_file: client certificates identify callers only with credentials: impersonate "
            "(a certificate cannot be forwarded, and in proxy mode every caller is kproxy)"
        )
    if cfg.admin_tls and cfg.tls is None:
        raise ConfigError("admin_tls: serves the admin listener with the certificate of tls, which is not set")
    return cfg


def metrics_authorized(cfg: Config) -> bool:
    """Whether /metrics on the admin listener needs an authorized bearer token (``metrics_access``)."""
    if cfg.metrics_access == "auto":
        return not is_loopback(cfg.admin_listen.host)
    return cfg.metrics_access == "authorized"


def load_config(path: str | Path | None) -> Config:
    """Read and validate a YAML config file (no file: all defaults)."""
    if path is None:
        return parse_config({})
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping at the top level")
    return parse_config(data)


def with_overrides(cfg: Config, **overrides: Any) -> Config:
    """Apply command-line overrides (None = not given) and re-validate."""
    data = cfg.model_dump()
    for key, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_config(data)
