"""The upstream's version as /version says it, and what kproxy assumes while it does not know."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kproxy.core.upstreamversion import UpstreamVersion, parse_version


@pytest.mark.parametrize(
    ("doc", "parsed"),
    [
        ({"major": "1", "minor": "37", "gitVersion": "v1.37.1"}, (1, 37)),
        ({"major": "1", "minor": "36+", "gitVersion": "v1.36.3-gke.100"}, (1, 36)),  # distributions' "+"
        ({"major": "1", "minor": ""}, None),
        ({"major": "1"}, None),
        ({"major": "one", "minor": "37"}, None),
        ({"major": "1", "minor": "37++"}, None),
        ({"major": "1", "minor": "9" * 40}, None),  # no unbounded numbers
        ("v1.37", None),
        (None, None),
    ],
)
def test_parse_version(doc: Any, parsed: tuple[int, int] | None) -> None:
    assert parse_version(doc) == parsed


def test_unknown_is_the_newest() -> None:
    """Until /version is read kproxy answers as the newest minor it supports."""
    unknown = UpstreamVersion()
    assert unknown.minor is None and unknown.at_least(37) and unknown.at_least(99)
    older = UpstreamVersion((1, 36))
    assert older.minor == 36 and older.at_least(36) and not older.at_least(37)


class _Api:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    async def json(self, method: str, target: str, **_: Any) -> tuple[int, Any]:
        assert (method, target) == ("GET", "/version")
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_read_keeps_the_last_answer_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kproxy.upstream")
    v = UpstreamVersion()
    api: Any = _Api(
        (200, {"major": "1", "minor": "36", "gitVersion": "v1.36.3"}),
        ConnectionRefusedError("down"),
        (503, {"kind": "Status"}),
        (200, {"major": "1", "minor": "37", "gitVersion": "v1.37.1"}),
        (200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"}),
    )
    await v.read(api)
    assert v.version == (1, 36) and v.git_version == "v1.36.3"
    await v.read(api)
    await v.read(api)
    assert v.version == (1, 36)
    caplog.clear()
    await v.read(api)  # upgraded in place
    assert v.version == (1, 37)
    assert "the upstream is Kubernetes v1.37.1 (was 1.36)" in caplog.text
    await v.read(api)
    assert "kproxy supports 1.35 to 1.37" in caplog.text
