"""When CPython's cyclic garbage collector may run in kproxy, whose heap is mostly long-lived.

A full collection walks every object the collector tracks, and every request and watch in the
process waits while it runs. CPython starts one whenever the objects that reached the oldest
generation since the last full collection come to a quarter of that generation. Measured in
kproxy (2-core machine, Python 3.11, a watch cache of 5,000 pods and 500 ConfigMaps;
docs/using/behaviour.md#garbage-collection):

- the heap of a started kproxy (modules, protobuf descriptors, config, filters) is about 60,000
  tracked objects: a full collection cost 40-47 ms with it, 11-14 ms without it;
- a YAML LIST of the 5,000 pods from the cache builds the whole list as Python objects: the
  oldest generation grew by a quarter again and again, and 18 full collections took 6.8 s of
  the 30 s that LIST took.

So:

- :func:`freeze_started` runs once kproxy is built, before it starts (loads persisted caches,
  listens): one collection, then ``gc.freeze()`` moves what is left to the permanent
  generation, which no later collection walks, and collection is enabled (``kproxy run`` holds
  it off while it imports and builds the server). Those objects live as long as the process
  (modules, the config, the server). Done after the start instead, the collection walked a
  persisted cache's objects too and delayed the first answers by tens of milliseconds.
- :func:`paused` holds automatic collection back while a block builds many long-lived or
  briefly-whole objects: a cache applying a list, a whole body converted to YAML or pretty
  JSON. Re-entrant (caches list at the same time); a pause ends by itself after
  ``MAX_PAUSE`` seconds.
- :func:`thaw` gives the frozen objects back to the collector: a config reload replaces filters
  that were frozen at start-up, and what of them is garbage must be collectable.
- :func:`observe_pauses` reports every collection's duration to a histogram
  (``kproxy_gc_pause_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Any, Protocol

log = logging.getLogger("kproxy.gcpolicy")  # the name it has always logged under

#: Seconds after which a pause ends even if the block it was for has not.
MAX_PAUSE = 60.0


class _State:
    depth = 0  # pauses in progress
    reenable = False  # whether the first pause disabled the collector (it was enabled)
    timer: asyncio.TimerHandle | None = None


_state = _State()


def freeze_started() -> None:
    """Collect once, then freeze what survives: start-up objects are out of every later walk.
    Collection is enabled afterwards (the caller may have held it off while it built them)."""
    gc.collect()
    gc.freeze()
    gc.enable()
    log.debug("gc: froze the start-up heap", extra={"frozen": gc.get_freeze_count()})


def thaw() -> None:
    """Return the frozen objects to the collector (they join the oldest generation)."""
    gc.unfreeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection while the block runs, for at most ``MAX_PAUSE`` seconds."""
    _pause()
    try:
        yield
    finally:
        _resume()


def _pause() -> None:
    st = _state
    st.depth += 1
    if st.depth > 1:
        return
    st.reenable = gc.isenabled()
    if st.reenable:
        gc.disable()
        try:
            st.timer = asyncio.get_running_loop().call_later(MAX_PAUSE, _expire)
        except RuntimeError:  # no running loop: the block cannot outlive its caller's call
            st.timer = None


def _resume() -> None:
    st = _state
    st.depth -= 1
    if st.depth == 0:
        _end()


def _expire() -> None:
    log.warning("gc: automatic collection was held back for %.0f s; it runs again", MAX_PAUSE)
    _state.timer = None
    _end()


def _end() -> None:
    st = _state
    if st.timer is not None:
        st.timer.cancel()
        st.timer = None
    if st.reenable:
        st.reenable = False
        gc.enable()


# ------------------------------------------------------------------------------- pause metrics


class _Histogram(Protocol):
    def labels(self, generation: str) -> Any: ...


class _Timing:
    children: tuple[Any, ...] = ()  # the histogram's series for generations 0, 1, 2
    started = 0.0


_timing = _Timing()


def _on_gc(phase: str, info: dict[str, int]) -> None:
    t = _timing
    if phase == "start":
        t.started = time.perf_counter()
    elif t.children:
        t.children[info["generation"]].observe(time.perf_counter() - t.started)


def observe_pauses(histogram: _Histogram | None) -> None:
    """Report each collection's duration to ``histogram`` (labelled by generation); None stops."""
    # Series resolved once: prometheus-client's labels() validates and locks on every call.
    _timing.children = () if histogram is None else tuple(histogram.labels(g) for g in ("0", "1", "2"))
    if histogram is not None and _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    elif histogram is None and _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)
