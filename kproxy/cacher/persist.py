"""The watch cache on disk: per resource, a snapshot at a resource version plus the events after it.

What is stored is what the cache holds: each object's bytes as they came from the upstream (the
protobuf message of a built-in kind, the JSON of a custom resource), the JSON a reader had made
of a protobuf object, and what the cache parsed out of it when it arrived (namespace, name,
resource version, labels, the fields selectors read), so that loading parses nothing: a restart
is ready to answer as soon as the files are read, and its first JSON reader finds the JSON made.

Files, in one directory (0700, owned by the process), each 0600:

- ``ID.snapshot``: the objects at one resource version, in key order, then a trailer with
  their count. Rewritten whole (``ID.snapshot.tmp``, fsync, rename, fsync of the directory) after
  each list and whenever the event log outgrows its bound.
- ``ID+EPOCH.events``: the events after that snapshot, appended as they arrive, and the resource
  versions bookmarks confirmed. ``EPOCH`` names the snapshot it follows: a rewrite starts a new
  log at once and removes the old one once the new snapshot is in place, so a crash in between
  leaves the old snapshot with its own, complete, log.

Every file starts with 8 magic bytes (``KPXWC1P\\n`` plain, ``KPXWC1E\\n`` encrypted), then
records framed as ``length (4 bytes) | CRC-32 of the payload (4 bytes) | payload``. An object's
payload is ``tag | length of the view (4 bytes) | the view as JSON | the stored bytes | the JSON
made of them``, the view being ``[namespace, name, resource version, labels, fields, length of
the stored bytes, whether they are protobuf]``. Encrypted
files hold each payload as ``nonce (12) | AES-GCM ciphertext and tag``, the file's kind, its
resource and the record's index as associated data: a record cannot be moved to another place,
file or resource. Whatever fails to read (a short record, a bad checksum or tag, a missing
trailer, a header for another resource or upstream, a file with loose permissions) makes the
whole resource's state unusable: its files are removed and the resource is listed as without
them. A valid prefix of the event log is not loaded either.

The snapshot's header also records the cluster it was listed from, as Kubernetes tools name a
cluster: the UID of its ``kube-system`` namespace (``cluster``, absent when unknown). The URL
and CA in the header's identity do not tell apart two clusters behind one URL and one CA; the
caller compares the recorded UID with the apiserver's before the state is resumed
(:class:`ClusterSource`), and a snapshot is written only once that UID is known.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import stat
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from .history import ADDED, DELETED, MODIFIED, CacheEvent
from .objects import CachedObject
from .watch_cache import WatchCache

log = logging.getLogger("kproxy.cache.persist")

FORMAT = 2  # 1 stored the bare objects (parsed again on load)
MAGIC_PLAIN = b"KPXWC1P\n"
MAGIC_SEALED = b"KPXWC1E\n"
_FRAME = struct.Struct(">II")
_VIEW = struct.Struct(">I")
_NONCE = 12
MAX_RECORD = 256 << 20  # no object comes close (etcd's limit is 1.5 MiB); a bigger length is corruption
_TYPES = {ADDED: b"A", MODIFIED: b"M", DELETED: b"D"}
_NAMES = {v: k for k, v in _TYPES.items()}
PROGRESS = b"P"
_OBJECT, _HEADER, _TRAILER = b"O", b"H", b"Z"


class Corrupt(Exception):
    """A persisted file that must not be loaded."""


#: Makes the cached object from its stored view: ``(namespace, name, resource version, labels,
#: fields, protobuf message or None, JSON or None)`` (:meth:`kproxy.cacher.ingest.ObjectFactory.restore`).
Restore = Callable[[str, str, int, dict[str, str], dict[str, str], bytes | None, bytes | None], CachedObject]


class UnsafeStorage(Exception):
    """The directory or key file is not private to this process (the message says why)."""


class ClusterSource(Protocol):
    """The identity of the cluster the states are written from (the UID of its ``kube-system``
    namespace), read from the apiserver once and shared by every store of the process."""

    def settled(self) -> bool:
        """Whether :meth:`read` answers without asking the apiserver."""
        ...

    async def read(self, since: float = 0.0) -> str | None:
        """The UID; None when it cannot be read (nothing is then persisted); raises when the
        apiserver could not be asked (another attempt later). ``since`` (``time.monotonic()``):
        the UID read by a request sent then or later (what the apiserver behind the URL says
        now, not what it said at start)."""
        ...


# -- encryption ---------------------------------------------------------------------------------


class Sealer:
    """AES-GCM with one key (16, 24 or 32 bytes), a random nonce per record."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # lazy: only with a key

        self._aead = AESGCM(key)

    def seal(self, data: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, data, aad)

    def open(self, data: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(data) < _NONCE + 16:
            raise Corrupt("encrypted record too short")
        try:
            return self._aead.decrypt(data[:_NONCE], data[_NONCE:], aad)
        except InvalidTag:
            raise Corrupt("encrypted record fails authentication (another key, or altered)") from None


def read_key_file(path: str) -> Sealer:
    """The key: base64 of 16, 24 or 32 random bytes (``head -c 32 /dev/urandom | base64``), in a
    regular file nobody else may write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise UnsafeStorage(f"encryption_key_file {path}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeStorage(f"encryption_key_file {path} is not a regular file")
        if st.st_mode & 0o022:
            raise UnsafeStorage(
                f"encryption_key_file {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
            )
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise UnsafeStorage(f"encryption_key_file {path}: not base64") from None
    if len(key) not in (16, 24, 32):
        raise UnsafeStorage(f"encryption_key_file {path}: the key is {len(key)} bytes; want 16, 24 or 32")
    return Sealer(key)


# -- the directory --------------------------------------------------------------------------------


def prepare_dir(path: str) -> Path:
    """Create ``path`` (0700) or check it: a directory owned by this process's user, not writable
    by group or others. Read bits for group or others are taken away (the files hold the cache)."""
    p = Path(path)
    try:
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(p, follow_symlinks=False)
    except OSError as err:
        raise UnsafeStorage(f"persist.dir {path}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStorage(f"persist.dir {path} is not a directory (or is a symbolic link)")
    if st.st_uid != os.geteuid():
        raise UnsafeStorage(f"persist.dir {path} is owned by uid {st.st_uid}, not by kproxy's uid {os.geteuid()}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeStorage(f"persist.dir {path} is writable by group or others (mode {mode:04o}); make it 0700")
    if mode != 0o700:
        os.chmod(p, 0o700)
        log.info("persist.dir %s: mode %04o made 0700", path, mode)
    return p


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a leftover (or something planted) is never written through
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _read_private(path: Path) -> bytes | None:
    """The file's bytes, None when absent; Corrupt unless a regular file of ours, mode 0600."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise Corrupt(f"{path.name}: {err.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise Corrupt(f"{path.name}: not a private file of kproxy's (mode {stat.S_IMODE(st.st_mode):04o})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


# -- records --------------------------------------------------------------------------------------


class _Framer:
    def __init__(self, sealer: Sealer | None, aad: bytes) -> None:
        self.sealer = sealer
        self.aad = aad
        self.seq = 0

    @property
    def magic(self) -> bytes:
        return MAGIC_SEALED if self.sealer is not None else MAGIC_PLAIN

    def frame(self, payload: bytes) -> bytes:
        if self.sealer is not None:
            payload = self.sealer.seal(payload, self.aad + self.seq.to_bytes(8, "big"))
        self.seq += 1
        return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    def records(self, data: bytes) -> Iterator[bytes]:
        """Each record's payload; Corrupt at the first one that is not whole and intact."""
        if data[: len(self.magic)] != self.magic:
            raise Corrupt("wrong magic (another format, or encrypted where plain is expected or back)")
        pos, end = len(self.magic), len(data)
        view = memoryview(data)
        while pos < end:
            if end - pos < _FRAME.size:
                raise Corrupt("torn record head at the end")
            n, crc = _FRAME.unpack_from(data, pos)
            pos += _FRAME.size
            if n > MAX_RECORD or pos + n > end:
                raise Corrupt("torn or overlong record")
            payload = view[pos : pos + n]
            if zlib.crc32(payload) != crc:
                raise Corrupt("record checksum mismatch")
            pos += n
            if self.sealer is not None:
                yield self.sealer.open(bytes(payload), self.aad + self.seq.to_bytes(8, "big"))
            else:
                yield bytes(payload)
            self.seq += 1


def _aad(kind: bytes, ident: str) -> bytes:
    return b"kproxy-watchcache\0" + kind + b"\0" + ident.encode() + b"\0"


def _header(payload: bytes, ident: str, identity: dict[str, Any], kind: str) -> dict[str, Any]:
    if payload[:1] != _HEADER:
        raise Corrupt("no header record")
    try:
        head = orjson.loads(payload[1:])
    except orjson.JSONDecodeError:
        raise Corrupt("unreadable header") from None
    if not isinstance(head, dict) or head.get("format") != FORMAT or head.get("kind") != kind:
        raise Corrupt("another format")
    if head.get("resource") != ident or head.get("identity") != identity:
        raise Corrupt("state of another resource or another upstream")
    if not isinstance(head.get("epoch"), int) or not isinstance(head.get("rv"), int):
        raise Corrupt("header without epoch or resource version")
    return head


@dataclass(slots=True)
class Loaded:
    rv: int
    epoch: int
    objects: list[bytes]
    events: list[tuple[str, bytes]] = field(default_factory=list)  # (type, object) or (PROGRESS, rv)
    events_bytes: int = 0
    snapshot_bytes: int = 0
    cluster: str | None = None  # the recorded UID of the cluster's kube-system namespace


def snapshot_bytes(
    ident: str,
    identity: dict[str, Any],
    sealer: Sealer | None,
    epoch: int,
    rv: int,
    objects: Sequence[CachedObject],
    spec: dict[str, Any] | None = None,
    cluster: str | None = None,
) -> bytes:
    framer = _Framer(sealer, _aad(b"snapshot", ident))
    head = {"format": FORMAT, "kind": "snapshot", "resource": ident, "identity": identity, "epoch": epoch, "rv": rv}
    head["spec"] = spec or {}
    if cluster is not None:
        head["cluster"] = cluster
    parts = [framer.magic, framer.frame(_HEADER + orjson.dumps(head))]
    parts.extend(framer.frame(_OBJECT + object_record(o)) for o in objects)
    parts.append(framer.frame(_TRAILER + len(objects).to_bytes(8, "big")))
    return b"".join(parts)


def read_state(directory: Path, ident: str, identity: dict[str, Any], sealer: Sealer | None) -> Loaded | None:
    """The persisted state of one resource; None when there is none; Corrupt when unusable."""
    data = _read_private(directory / f"{ident}.snapshot")
    if data is None:
        return None
    framer = _Framer(sealer, _aad(b"snapshot", ident))
    records = framer.records(data)
    head = _header(next(records, b""), ident, identity, "snapshot")
    objects: list[bytes] = []
    count = -1
    for payload in records:
        if count >= 0:
            raise Corrupt("records after the snapshot's trailer")
        tag = payload[:1]
        if tag == _OBJECT:
            objects.append(payload[1:])
        elif tag == _TRAILER:
            count = int.from_bytes(payload[1:], "big")
        else:
            raise Corrupt("unknown snapshot record")
    if count != len(objects):
        raise Corrupt("snapshot without its trailer (torn)" if count < 0 else "snapshot count mismatch")
    state = Loaded(head["rv"], head["epoch"], objects, snapshot_bytes=len(data))
    recorded = head.get("cluster")
    state.cluster = recorded if isinstance(recorded, str) and recorded else None
    events = _read_private(directory / f"{ident}+{state.epoch}.events")
    if events is not None:
        framer = _Framer(sealer, _aad(b"events", ident))
        records = framer.records(events)
        ehead = _header(next(records, b""), ident, identity, "events")
        if ehead["epoch"] != state.epoch:
            raise Corrupt("event log of another snapshot")
        for payload in records:
            tag = payload[:1]
            if tag == PROGRESS:
                state.events.append(("P", payload[1:]))
            elif tag in _NAMES:
                state.events.append((_NAMES[tag], payload[1:]))
            else:
                raise Corrupt("unknown event record")
        state.events_bytes = len(events)
    return state


def persisted(directory: Path, sealer: Sealer | None) -> list[tuple[str, dict[str, Any] | None]]:
    """(file id, snapshot header) of each resource with a snapshot: what can be loaded before
    the upstream is asked anything (its objects are checked when loaded). The header is None
    when it does not read (damaged, encrypted with another key or without one, not private)."""
    found: list[tuple[str, dict[str, Any] | None]] = []
    for path in sorted(directory.glob("*.snapshot")):
        ident = path.name[: -len(".snapshot")]
        try:
            head = _read_head(path, ident, sealer)
        except (Corrupt, OSError, ValueError) as err:
            log.debug("%s: header not readable (%s)", path.name, err)
            head = None
        found.append((ident, head))
    return found


def _read_head(path: Path, ident: str, sealer: Sealer | None) -> dict[str, Any] | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            start = f.read(len(MAGIC_PLAIN) + _FRAME.size)
            if len(start) < len(MAGIC_PLAIN) + _FRAME.size:
                return None
            n, _ = _FRAME.unpack_from(start, len(MAGIC_PLAIN))
            if n > 1 << 20:
                return None
            data = start + f.read(n)
    finally:
        os.close(fd)
    magic = data[: len(MAGIC_PLAIN)]
    if magic == MAGIC_SEALED and sealer is None:
        return None
    framer = _Framer(sealer if magic == MAGIC_SEALED else None, _aad(b"snapshot", ident))
    payload = next(framer.records(data), b"")
    if payload[:1] != _HEADER:
        return None
    head = orjson.loads(payload[1:])
    return head if isinstance(head, dict) and head.get("format") == FORMAT else None


def discard(directory: Path, ident: str) -> None:
    """Remove every file of the resource."""
    for path in directory.glob(f"{ident}.snapshot*"):
        with contextlib.suppress(OSError):
            path.unlink()
    for path in directory.glob(f"{ident}+*.events"):
        with contextlib.suppress(OSError):
            path.unlink()


def _write_snapshot(directory: Path, ident: str, data: bytes, keep_events: str) -> None:
    """Write, sync and put in place the snapshot; then remove every other event log."""
    tmp = directory / f"{ident}.snapshot.tmp"
    fd = _create(tmp)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / f"{ident}.snapshot")
    _fsync_dir(directory)
    for path in directory.glob(f"{ident}+*.events"):
        if path.name != keep_events:
            with contextlib.suppress(OSError):
                path.unlink()


def object_record(obj: CachedObject) -> bytes:
    """What is stored of ``obj`` (the module's docstring has the layout)."""
    proto = obj.proto
    if proto is not None:
        stored, made = proto, (obj.item_json if obj.has_json else b"")
    else:
        stored, made = obj.item_json, b""
    view = orjson.dumps([obj.namespace, obj.name, obj.rv, obj.labels, obj.fields, len(stored), proto is not None])
    return _VIEW.pack(len(view)) + view + stored + made


def restore_record(record: bytes, restore: Restore) -> CachedObject:
    """The cached object of an :func:`object_record` (checksummed, so only damage that the
    checksum cannot see, or a record made by another program, fails here: Corrupt)."""
    if len(record) < _VIEW.size:
        raise Corrupt("object record too short")
    (n,) = _VIEW.unpack_from(record)
    start = _VIEW.size + n
    try:
        ns, name, rv, labels, fields, size, is_proto = orjson.loads(record[_VIEW.size : start])
    except (orjson.JSONDecodeError, ValueError, TypeError):
        raise Corrupt("object record without its view") from None
    if not (
        isinstance(ns, str)
        and isinstance(name, str)
        and isinstance(rv, int)
        and isinstance(labels, dict)
        and isinstance(fields, dict)
        and isinstance(size, int)
        and 0 <= size <= len(record) - start
    ):
        raise Corrupt("object record with a malformed view")
    stored = record[start : start + size]
    if is_proto is True:
        return restore(ns, name, rv, labels, fields, stored, record[start + size :] or None)
    if is_proto is False and start + size == len(record):
        return restore(ns, name, rv, labels, fields, None, stored)
    raise Corrupt("object record with a malformed view")


# -- one resource's store ---------------------------------------------------------------------------


class ResourceStore:
    """Keeps one WatchCache's state on disk as it changes.

    ``owners`` is shared by every store of the process: a store writes only while it is the
    registered owner of its resource (a config reload starts a new one before the old stops)."""

    def __init__(
        self,
        directory: Path,
        ident: str,
        identity: dict[str, Any],
        sealer: Sealer | None,
        *,
        compact_min_bytes: int = 8 << 20,
        owners: dict[str, object] | None = None,
        progress_interval: float = 5.0,
        spec: dict[str, Any] | None = None,
        cluster: ClusterSource | None = None,
    ) -> None:
        self.directory = directory
        # Whose state this is: recorded in each snapshot (None: nothing recorded).
        self.cluster = cluster
        self._unwritten = False  # the last snapshot was not written: the cluster was not known yet
        # When the cache was last listed again: its snapshot records the cluster's UID as read
        # since (the cluster behind the URL may have changed, which is why it listed).
        self._listed_at = 0.0
        self._relists = 0
        # The loaded state is not yet confirmed as the cluster's (its owner compares the recorded
        # UID): no snapshot of it is written meanwhile, which would record the UID found for it.
        self.unconfirmed = False
        self.spec = spec or {}
        self.ident = ident
        self.identity = identity
        self.sealer = sealer
        self.compact_min_bytes = compact_min_bytes
        self.progress_interval = progress_interval
        self._owners = owners if owners is not None else {}
        self._owners[ident] = self
        self._cache: WatchCache | None = None
        self._epoch = 0
        self._fd: int | None = None
        self._framer: _Framer | None = None
        self._buf = bytearray()
        self._flush_handle: asyncio.Handle | None = None
        self._log_bytes = 0
        self._snap_bytes = 0
        self._snap_json = 0  # objects whose JSON the last snapshot holds
        self._persisted_rv = 0
        self._compacting: asyncio.Task[None] | None = None
        self._compact_again = False
        # A list replaced the state while a snapshot was being written: nothing is logged until
        # the next snapshot (the log's base would miss the list's differences).
        self._suspended = False
        self._ticker: asyncio.Task[None] | None = None
        self.compactions = 0
        self.failed = ""  # the last write error (the store stops writing after one)
        self.load_outcome = "none"  # what load() found: none, loaded or discarded

    # -- loading ----------------------------------------------------------------------------------
    def load(self, restore: Restore, cache: WatchCache) -> Loaded | None:
        """Fill ``cache`` from disk (before its reflector starts); None (nothing loaded) when
        there is no state or it is unusable (then removed, with a log line saying why)."""
        try:
            state = read_state(self.directory, self.ident, self.identity, self.sealer)
        except Corrupt as err:
            log.warning("%s: persisted state not loaded (%s); removed, the resource is listed", self.ident, err)
            discard(self.directory, self.ident)
            self.load_outcome = "discarded"
            return None
        if state is None:
            return None
        try:
            objects = [restore_record(b, restore) for b in state.objects]
            cache.replace(objects, state.rv)
            self._snap_json = sum(o.has_json for o in objects)
            for type_, payload in state.events:
                if type_ == "P":
                    cache.progress(int.from_bytes(payload, "big"))
                else:
                    cache.apply(type_, restore_record(payload, restore))
        except Exception as err:  # bytes that checksum right but do not decode: same as corrupt
            log.warning("%s: persisted objects not readable (%s); removed, the resource is listed", self.ident, err)
            discard(self.directory, self.ident)
            cache.unready()
            cache.store.clear()
            self.load_outcome = "discarded"
            return None
        self._epoch = state.epoch
        self._log_bytes = state.events_bytes
        self._snap_bytes = state.snapshot_bytes
        self._persisted_rv = cache.applied_rv
        self.load_outcome = "loaded"
        return state

    # -- writing ----------------------------------------------------------------------------------
    def attach(self, cache: WatchCache, loaded: Loaded | None) -> None:
        """Follow ``cache`` from now on: events appended, each list a new snapshot."""
        self._cache = cache
        if loaded is not None:
            path = self.directory / f"{self.ident}+{self._epoch}.events"
            try:
                if path.exists():
                    self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
                    self._framer = _Framer(self.sealer, _aad(b"events", self.ident))
                    self._framer.seq = 1 + len(loaded.events)
                else:
                    self._open_log(self._epoch, loaded.rv)
            except OSError as err:
                self._fail(err)
        cache.add_listener(self._on_events)
        cache.add_replace_listener(self._on_replace)
        cache.add_reset_listener(self._on_reset)
        self._ticker = asyncio.create_task(self._tick())

    @property
    def owner(self) -> bool:
        return self._owners.get(self.ident) is self and not self.failed

    def _fail(self, err: BaseException) -> None:
        self.failed = f"{type(err).__name__}: {err}"
        log.warning("%s: writing the persisted state failed (%s); not persisted any more", self.ident, self.failed)
        self._close_fd()
        with contextlib.suppress(OSError):
            discard(self.directory, self.ident)  # a stale state would be loaded next time

    def _open_log(self, epoch: int, rv: int) -> None:
        framer = _Framer(self.sealer, _aad(b"events", self.ident))
        head = {"format": FORMAT, "kind": "events", "resource": self.ident, "identity": self.identity}
        head |= {"epoch": epoch, "rv": rv}
        fd = _create(self.directory / f"{self.ident}+{epoch}.events")
        data = framer.magic + framer.frame(_HEADER + orjson.dumps(head))
        os.write(fd, data)
        self._close_fd()
        self._fd, self._framer, self._log_bytes = fd, framer, len(data)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _on_events(self, events: list[CacheEvent]) -> None:
        cache = self._cache
        if cache is None or cache.replacing or self._framer is None or self._suspended or not self.owner:
            return  # a list's differences: the list's snapshot holds their result
        framer = self._framer
        for ev in events:
            self._buf += framer.frame(_TYPES[ev.type] + object_record(ev.obj))
        self._persisted_rv = max(self._persisted_rv, cache.applied_rv)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what is buffered (one write: a process killed meanwhile leaves whole records)."""
        self._flush_handle = None
        if not self._buf or self._fd is None or not self.owner:
            self._buf.clear()
            return
        data, self._buf = bytes(self._buf), bytearray()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as err:
            self._fail(err)
            return
        self._log_bytes += len(data)
        if self._log_bytes > max(self.compact_min_bytes, self._snap_bytes):
            self.compact()

    def _note_progress(self) -> None:
        """A bookmark moved the cache on without events: say so, so a restart resumes from there."""
        cache = self._cache
        if cache is None or self._framer is None or self._suspended or not self.owner or cache.replacing:
            return
        if cache.applied_rv > self._persisted_rv:
            self._persisted_rv = cache.applied_rv
            self._buf += self._framer.frame(PROGRESS + cache.applied_rv.to_bytes(8, "big"))
            self._schedule_flush()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.progress_interval)
            if self._unwritten:
                self.compact()
            self._note_progress()

    def disable(self) -> None:
        """Persist nothing any more, and remove what is on disk (the cluster cannot be told)."""
        self.failed = "the cluster's identity cannot be read"
        self._buf.clear()
        self._close_fd()
        self._framer = None
        with contextlib.suppress(OSError):
            discard(self.directory, self.ident)

    def _on_reset(self) -> None:
        """The upstream stopped serving the resource (the cache turned unready): what is on
        disk must not be served by a restarted kproxy. The next list writes a new snapshot."""
        cache = self._cache
        if cache is None or cache.ready or not self.owner:
            return  # ready: the upstream went back in time, and the list's snapshot follows
        self._buf.clear()
        self._close_fd()
        self._framer = None
        discard(self.directory, self.ident)

    def _on_replace(self) -> None:
        cache = self._cache
        if cache is not None and cache.relists != self._relists:
            # Listed again (a 410, a broken watch the upstream could not resume): the apiserver
            # may be another cluster's now (blue/green behind one address), so the snapshot of
            # this list records the UID as read after it, not the one read at start: a restart
            # against the first cluster must not take this list for its own.
            self._relists = cache.relists
            self._listed_at = time.monotonic()
        self.flush_pending_only()  # events before the list, on the state it replaces
        if self._compacting is not None and not self._compacting.done():
            self._suspended = True
        self.compact()

    def compact(self) -> None:
        """Write a new snapshot of the current state (in a thread) and start a new event log."""
        cache = self._cache
        if cache is None or not cache.ready or not self.owner or self.unconfirmed:
            return
        if self._compacting is not None and not self._compacting.done():
            self._compact_again = True
            return
        self.flush_pending_only()
        self._suspended = False
        rv = cache.applied_rv
        snap = cache.snapshot()
        assert snap is not None
        objects = list(snap.objects)
        self._snap_json = sum(o.has_json for o in objects)
        epoch = self._epoch + 1
        try:
            self._open_log(epoch, rv)  # events from now on follow the new snapshot
        except OSError as err:
            self._fail(err)
            return
        self._epoch = epoch
        self._persisted_rv = rv
        self._compacting = asyncio.create_task(self._write(epoch, rv, objects))

    def flush_pending_only(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self.owner:
            self._buf.clear()
        if self._buf and self._fd is not None:
            data, self._buf = bytes(self._buf), bytearray()
            try:
                os.write(self._fd, data)
            except OSError as err:
                self._fail(err)

    async def _write(self, epoch: int, rv: int, objects: list[CachedObject]) -> None:
        keep = f"{self.ident}+{epoch}.events"
        self._unwritten = False
        uid: str | None = None
        if self.cluster is not None:
            try:
                uid = await self.cluster.read(self._listed_at)
            except Exception as err:
                # Not written now (the previous snapshot and its own log stay a consistent, older
                # state): tried again on the next tick.
                log.debug("%s: snapshot not written yet, the cluster's identity unknown (%s)", self.ident, err)
                self._unwritten = True
                return
            if uid is None:
                self.disable()
                return
        try:
            data = await asyncio.to_thread(
                snapshot_bytes, self.ident, self.identity, self.sealer, epoch, rv, objects, self.spec, uid
            )
            if not self.owner:
                return
            await asyncio.to_thread(_write_snapshot, self.directory, self.ident, data, keep)
        except OSError as err:
            self._fail(err)
            return
        self._snap_bytes = len(data)
        self.compactions += 1
        log.debug("%s: snapshot at resource version %d written (%d bytes)", self.ident, rv, len(data))
        if self._compact_again:
            self._compact_again = False
            self.compact()

    def forget(self) -> None:
        """Remove the resource's files (after ``close``), unless a newer store owns them."""
        if self._owners.get(self.ident) in (None, self):
            discard(self.directory, self.ident)

    def _json_made_since_snapshot(self, cache: WatchCache) -> bool:
        if not (self.owner and cache.ready and self._framer is not None and not self._suspended):
            return False
        snap = cache.snapshot()
        if snap is None:
            return False
        made = sum(o.has_json for o in snap.objects)
        return made - self._snap_json > max(100, len(snap.objects) // 10)

    async def close(self) -> None:
        """Write out what is pending (the last bookmark's resource version too) and sync."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        cache = self._cache
        if cache is not None:
            cache.remove_listener(self._on_events)
            cache.remove_replace_listener(self._on_replace)
            cache.remove_reset_listener(self._on_reset)
        task = self._compacting
        if task is not None:
            with contextlib.suppress(Exception):
                await task
        settled = self.cluster is None or self.cluster.settled()  # no request to the apiserver now
        if cache is not None and settled and (self._unwritten or self._json_made_since_snapshot(cache)):
            # Readers had the JSON of many objects made since the snapshot: keep it, so that the
            # next start's first JSON reader does not make it again.
            self.compact()
            if self._compacting is not None and self._compacting is not task:
                with contextlib.suppress(Exception):
                    await self._compacting
        self._note_progress()
        self.flush_pending_only()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
        self._close_fd()
        if self._owners.get(self.ident) is self:
            del self._owners[self.ident]
