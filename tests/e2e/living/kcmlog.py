"""What a kube-controller-manager's log says about its informers and event recorder, counted.

The controller-manager exports no client-go reflector metrics (client-go's reflector metrics are no-ops
unless a provider is registered, and the controller-manager registers none), so the facts come from its
klog text log. Each fact is a line client-go v1.37 or the controllers write; the levels matter, hence
:data:`VMODULE`:

* ``reflector.go`` (k8s.io/client-go/tools/cache/reflector.go): ``"Starting reflector"`` (V(3), once per
  reflector), ``"Listing and watching"`` (V(3), once per ListAndWatch: the first list, then every
  relist), ``"Caches populated"`` (V(2), a list that completed), ``"Watch closed" ... err="too old
  resource version: ..."`` (V(4): a watch ended by a 410 Expired/Gone, in the stream or as the answer
  to the watch request; the reflector then lists again), ``"Failed to watch"`` (an error of a list or
  of a watch client-go does not retry — anything but a refused connection or a 429 —, printed by
  utilruntime.HandleError from DefaultWatchErrorHandler; the reflector then lists again).
* ``event.go`` (tools/record/event.go, and tools/events/event_broadcaster.go): ``"Server rejected
  event (will not retry!)"`` (an answer that was a Status error: the event is dropped),
  ``"Unable to write event (retry limit exceeded!)"`` (12 failed tries: dropped), ``"Unable to
  construct event (will not retry!)"``; ``"Unable to write event (may retry after sleeping)"`` is a
  retry, not a loss.
* pkg/controller/util/consistency/consistency.go: ``read version: N is not as new as written
  version: M for group resource R`` (a controller whose informer has not yet seen its own write skips
  the sync and retries; the ReplicaSet, Job, DaemonSet and StatefulSet controllers print it).

A reflector is known by its type (``*v1.Pod``; ``*v1.PartialObjectMetadata`` for the metadata informers
of the garbage collector and the quota controller): its name is the same call site for all of them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: The controller-manager flag that makes reflector.go print the lines counted here (V(4) for the
#: 410s) and nothing else more verbose.
VMODULE = "--vmodule=reflector=4"

_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.-]+):\d+\] \"((?:[^\"\\]|\\.)*)\"(.*)$")
_KV = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: How a 410 reads in a reflector's error: the apiserver's watch cache and etcd3 store say "too old
#: resource version: X (Y)"; a list or continue answered 410 says "The resourceVersion for the provided
#: list is too old." (apimachinery's NewResourceExpired / storage errors).
_EXPIRED = re.compile(r"too old resource version|resourceVersion for the provided \w+ is too old|\(Expired\)|\(Gone\)")
_READ_VERSION = re.compile(r"read version: (\d+) is not as new as written version: (\d+) for group resource ([\w.-]+)")
#: What ended a ListAndWatch, by the words of its error (first match wins).
_FAILURE_REASONS = (
    ("forbidden", re.compile(r"is forbidden")),
    ("unauthorized", re.compile(r"Unauthorized")),
    ("410 expired", _EXPIRED),
    ("429", re.compile(r"too many requests|Too Many Requests|TooManyRequests", re.I)),
    ("503", re.compile(r"currently unable to handle the request|ServiceUnavailable|unavailable", re.I)),
    ("connection", re.compile(r"connection refused|connection reset|EOF|broken pipe|i/o timeout", re.I)),
)
_LOST_EVENT = (
    "Server rejected event (will not retry!)",
    "Unable to write event (retry limit exceeded!)",
    "Unable to construct event (will not retry!)",
)
_RETRIED_EVENT = "Unable to write event (may retry after sleeping)"


@dataclass
class KcmLog:
    """Counts from a stretch of a controller-manager log, by reflector type where it applies."""

    started: Counter[str] = field(default_factory=Counter)
    #: ListAndWatch calls (the first list of each reflector included).
    lists: Counter[str] = field(default_factory=Counter)
    #: Lists that completed.
    populated: Counter[str] = field(default_factory=Counter)
    #: 410s a reflector saw (watch or list).
    expired: Counter[str] = field(default_factory=Counter)
    #: Lists again that followed a 410 of the same type.
    relists_after_410: Counter[str] = field(default_factory=Counter)
    #: Errors that end a ListAndWatch ("Failed to watch"), by type.
    failed: Counter[str] = field(default_factory=Counter)
    #: The same, by what their error says (forbidden, 410 expired, 429, 503, connection, other).
    failure_reasons: Counter[str] = field(default_factory=Counter)
    #: "Warning: watch ended with error" (a watch error that is neither 410, 429 nor retried 500).
    watch_errors: Counter[str] = field(default_factory=Counter)
    lost_events: int = 0
    retried_events: int = 0
    #: "read version ... is not as new as written version" lines, by group resource.
    read_version: Counter[str] = field(default_factory=Counter)
    lost_event_lines: list[str] = field(default_factory=list)

    @property
    def relists(self) -> Counter[str]:
        """ListAndWatch calls beyond each reflector's first, by type."""
        out: Counter[str] = Counter()
        for t, n in self.lists.items():
            if n > self.started[t]:
                out[t] = n - self.started[t]
        return out

    def summary(self) -> dict[str, int]:
        """The totals, for a side-by-side table."""
        return {
            "relists": sum(self.relists.values()),
            "410s": sum(self.expired.values()),
            "relists after a 410": sum(self.relists_after_410.values()),
            "failed list/watch": sum(self.failed.values()),
            "lost events": self.lost_events,
            "retried event writes": self.retried_events,
            "read-version lines": sum(self.read_version.values()),
        }


def parse(text: str) -> KcmLog:
    """Count the facts in ``text`` (klog's text format, one entry a line; other lines are skipped)."""
    out = KcmLog()
    pending_410: Counter[str] = Counter()
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        _severity, source, msg, rest = m.groups()
        if source == "reflector.go":
            kv = dict(_KV.findall(rest))
            kind = kv.get("type", "?")
            err = kv.get("err", "")
            if msg == "Starting reflector":
                out.started[kind] += 1
            elif msg == "Listing and watching":
                out.lists[kind] += 1
                if pending_410[kind]:
                    pending_410[kind] -= 1
                    out.relists_after_410[kind] += 1
            elif msg == "Caches populated":
                out.populated[kind] += 1
            elif msg == "Failed to watch":
                out.failed[kind] += 1
                out.failure_reasons[next((r for r, rx in _FAILURE_REASONS if rx.search(err)), "other")] += 1
            elif msg == "Warning: watch ended with error":
                out.watch_errors[kind] += 1
            if msg in ("Watch closed", "Failed to watch", "Warning: watch ended with error") and _EXPIRED.search(err):
                out.expired[kind] += 1
                pending_410[kind] += 1
        if msg in _LOST_EVENT:
            out.lost_events += 1
            out.lost_event_lines.append(line[:400])
        elif msg == _RETRIED_EVENT:
            out.retried_events += 1
        rv = _READ_VERSION.search(line)
        if rv is not None:
            out.read_version[rv.group(3)] += 1
    return out


def read(path: Path, offset: int = 0) -> KcmLog:
    """Count the facts in ``path`` from byte ``offset`` on (a log the components append to)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return parse(f.read().decode(errors="replace"))


def type_kind(type_description: str) -> str:
    """The kind of a reflector type: ``*v1.Pod`` -> ``Pod``; ``*v1.PartialObjectMetadata`` stays as is."""
    return type_description.rsplit(".", 1)[-1]
