"""The tests' one polling helper: it returns the value that satisfied the condition, and a timeout
names what was waited for and the last value or exception the probe gave."""

from __future__ import annotations

import itertools

import pytest

from kproxy.testing.eventually import Timeout, eventually, eventually_async


def test_returns_the_first_value_that_satisfies() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter), 5, "the third try", 0, until=lambda n: n >= 2) == 2


def test_a_timeout_names_what_and_the_last_value() -> None:
    counter = itertools.count()
    with pytest.raises(Timeout) as err:
        eventually(lambda: next(counter), 0.05, "the counter to go negative", 0.01, until=lambda n: n < 0)
    assert err.value.last == err.value.attempts - 1 >= 1
    assert "waiting for the counter to go negative" in str(err.value)
    assert f"last value: {err.value.last}" in str(err.value)


def test_ignored_exceptions_count_as_not_yet_and_are_reported() -> None:
    def probe() -> bool:
        raise ConnectionRefusedError("not listening")

    with pytest.raises(Timeout, match="last exception: ConnectionRefusedError"):
        eventually(probe, 0.05, "a listener", 0.01, ignore=(OSError,))


def test_other_exceptions_propagate_at_once() -> None:
    calls = []

    def probe() -> bool:
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        eventually(probe, 5, "anything", 0.01, ignore=(OSError,))
    assert calls == [1]


async def test_the_async_form_awaits_a_coroutine_probe_and_fails_alike() -> None:
    counter = itertools.count()

    async def probe() -> int:
        return next(counter)

    assert await eventually_async(probe, 5, "three", 0, until=lambda n: n == 3) == 3
    with pytest.raises(Timeout, match=r"waiting for never; last value: False"):
        await eventually_async(lambda: False, 0.05, "never", 0.01)
