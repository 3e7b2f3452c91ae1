"""The ``watchcache`` filter's settings (``WatchCacheSettings``: which resources, the history
window, authorization reuse, persistence, reads through an outage)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kproxy.filters.watchcache.outage_serving import OutageSettings
from kproxy.filters.watchcache.resources import CONFIRMATION_SPACING, CONFIRMATIONS, ResourceNames, parse_name

__all__ = ["ALWAYS_SENSITIVE", "AuthorizationSettings", "PersistSettings", "WatchCacheSettings"]


class AuthorizationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allow_ttl: float = Field(10.0, ge=0, description="Seconds an allowed decision is reused.")
    deny_ttl: float = Field(5.0, ge=0, description="Seconds a denied decision is reused.")
    max_entries: int = Field(10000, ge=1, description="Decisions kept (least recently used dropped first).")


def _default_authorization() -> AuthorizationSettings:
    return AuthorizationSettings.model_validate({})


def _default_outage() -> OutageSettings:
    return OutageSettings.model_validate({})


#: Resources persisted only when ``persist.resources`` names them (not through ``*``), and then
#: encrypted; ``persist.sensitive`` adds to it.
ALWAYS_SENSITIVE = ("secrets",)


class PersistSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dir: str = Field(
        min_length=1,
        description="Directory of the persisted state, created 0700 if absent; kproxy refuses to start when it "
        "is not owned by kproxy's user or is writable by group or others. One kproxy process per directory.",
    )
    resources: ResourceNames = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="Which cached resources are persisted (names as in `resources`; `*`: all of them except "
        "the sensitive ones).",
    )
    sensitive: ResourceNames = Field(
        default_factory=list,
        description="Resources persisted only when `persist.resources` names them, and then encrypted "
        "(Secrets always are).",
    )
    encryption_key_file: str | None = Field(
        None,
        description="File holding base64 of a 16, 24 or 32 byte AES-GCM key (`head -c 32 /dev/urandom | base64`): "
        "required to persist a sensitive resource. Another key, or none, makes kproxy drop what was persisted "
        "with the old one and list.",
    )
    compact_min_bytes: int = Field(
        8 << 20,
        ge=4096,
        description="A resource's snapshot is rewritten when its event log grows past this many bytes and "
        "past the snapshot's own size.",
    )

    @model_validator(mode="after")
    def _key_for_sensitive(self) -> PersistSettings:
        if self.encryption_key_file:
            return self
        sensitive = [parse_name(n) for n in (*ALWAYS_SENSITIVE, *self.sensitive)]
        for name in self.resources:
            group, _, resource = parse_name(name)
            if resource == "*":
                continue
            for s_group, _, s_resource in sensitive:
                if resource == s_resource and (group is None or s_group is None or group == s_group):
                    raise ValueError(
                        f"resources names {name!r}, a sensitive resource: it is persisted only encrypted; "
                        "set encryption_key_file"
                    )
        return self


class WatchCacheSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resources: ResourceNames = Field(
        min_length=1,
        description="Resources to cache: RESOURCE, RESOURCE.GROUP, GROUP/VERSION/RESOURCE, v1/RESOURCE, or * "
        "(every list+watch resource in discovery, custom resources followed as they come and go).",
    )
    history_window: float = Field(75.0, gt=0, description="Seconds of events kept (the apiserver's 75 s).")
    history_max_events: int = Field(102400, ge=100, description="At most this many events kept per resource.")
    wait_timeout: float = Field(
        3.0, gt=0, description="Seconds a read waits for the cache to reach a resource version (the apiserver's 3 s)."
    )
    page_size: int = Field(500, ge=1, description="Page size of upstream lists when streaming lists are unavailable.")
    rediscovery_interval: float = Field(
        30.0,
        gt=0,
        description="Seconds between discovery refreshes with `*`. A cached resource discovery stops "
        f"listing is dropped after {CONFIRMATIONS} reads in a row lack it, the apiserver ready (/readyz) at "
        f"each, at most {CONFIRMATION_SPACING:.0f} s (or this interval) apart; a custom resource is dropped "
        "as soon as its definition is deleted.",
    )
    encode_ahead: bool = Field(
        True,
        description="Make each built-in object's JSON in the background as it arrives, so the first "
        "JSON list is served at cache speed (memory: the JSON is kept next to the protobuf).",
    )
    authorization: AuthorizationSettings = Field(default_factory=_default_authorization)
    watch_buffer: int = Field(
        100,
        ge=1,
        description="Events queued per watcher while its connection takes nothing; past that, and past "
        "the time budget, the watcher is closed (the apiserver's 100 for most resources).",
    )
    min_request_timeout: float = Field(
        1800.0,
        gt=0,
        description="A watch without timeoutSeconds ends after a random time in [this, 2 x this) seconds "
        "(the apiserver's --min-request-timeout).",
    )
    bookmark_interval: float = Field(
        60.0, gt=0, description="Seconds between bookmarks for watchers that allow them (the apiserver's 1 min)."
    )
    persist: PersistSettings | None = Field(
        None,
        description="Keep the cache on disk (off by default): a restarted kproxy serves resourceVersion=0 "
        "and not-older-than reads from it at once and resumes the upstream watches from where it stopped "
        '(docs/using/watchcache.md, "A cache that survives restarts").',
    )
    write_wait: float = Field(
        1.0,
        ge=0,
        description="Seconds at most the answer to a write of a cached resource waits until the cache has "
        "written the write's own event to its watchers, so that a controller's informer has it before "
        "the answer (0: never wait).",
    )
    outage: OutageSettings = Field(
        default_factory=_default_outage,
        description="Reads through an outage (off by default): while the apiserver cannot be reached, cached "
        'reads are served with a Warning saying how old the cache may be (docs/using/watchcache.md, "Reads '
        'through an outage").',
    )
