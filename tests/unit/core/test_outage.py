"""kproxy.core.outage: which answer a request the upstream could not complete gets."""

from __future__ import annotations

import json

import pytest

from kproxy.core.outage import NoAnswer, upstream_failed
from kproxy.core.status import StatusError


@pytest.mark.parametrize("method", ["GET", "HEAD", "get"])
def test_a_read_gets_a_429_with_retry_after(method: str) -> None:
    answer = upstream_failed(method, "[Errno 111] Connection refused")
    assert isinstance(answer, StatusError)
    assert answer.headers()["Retry-After"] == "1"
    assert json.loads(answer.body()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the upstream kube-apiserver is unavailable: [Errno 111] Connection refused",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1},
        "code": 429,
    }


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
def test_a_write_cut_off_after_it_was_sent_gets_no_answer(method: str) -> None:
    answer = upstream_failed(method, "Server disconnected")
    assert isinstance(answer, NoAnswer)
    assert str(answer) == "the upstream kube-apiserver is unavailable: Server disconnected"


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_write_that_never_left_gets_a_429_to_come_back_in_5s(method: str) -> None:
    """The apiserver's own answer to a write it did not process while it shuts down (with_retry_after.go)."""
    answer = upstream_failed(method, "Connection refused", sent=False)
    assert isinstance(answer, StatusError)
    assert answer.headers()["Retry-After"] == "5"
    status = json.loads(answer.body())
    assert status["code"] == 429 and status["reason"] == "TooManyRequests"
    assert status["details"] == {"retryAfterSeconds": 5}
