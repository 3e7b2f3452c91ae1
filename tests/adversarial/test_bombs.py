"""Decoding bombs: a few hundred bytes of YAML (aliases) or deep nesting must cost kproxy bounded
work and memory, answer as the apiserver does, and never stall other callers meanwhile. Each runs
against its own memory-capped kproxy, killed afterwards, so a failure cannot take the machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from . import bodies as b
from .conftest import POLICY_FILTERS, Twins
from .wire import Answer, Endpoint, exchange, request_bytes

#: How long another caller's request may wait while a bomb is being handled (the loop must not block).
STALL_LIMIT = 1.0


def _rss(rp: RunningProxy) -> int:
    status = Path(f"/proc/{rp.proc.pid}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


CASES = {
    # (policy, credentials, method, target, content type, body, anonymous)
    "enforce-delete-alias-bomb": ("enforce", "proxy", "DELETE", "/api/v1/namespaces/{ns}/configmaps/x",
                                  b.YAML, b.yaml_alias_bomb()),
    "strict-create-alias-bomb": ("strict", "proxy", "POST", "/api/v1/namespaces/{ns}/configmaps",
                                 b.YAML, b.yaml_alias_bomb_cm("bomb")),
    "strict-apply-alias-bomb": ("strict", "proxy", "PATCH", "/api/v1/namespaces/{ns}/configmaps/bomb?fieldManager=a",
                                b.APPLY_YAML, b.yaml_alias_bomb_cm("bomb")),
    "enforce-anonymous-alias-bomb": ("enforce", "forward", "DELETE", "/api/v1/namespaces/{ns}/configmaps/x",
                                     b.YAML, b.yaml_alias_bomb()),
    "strict-anonymous-alias-bomb": ("strict", "forward", "POST", "/api/v1/namespaces/{ns}/configmaps",
                                    b.YAML, b.yaml_alias_bomb_cm("bomb")),
    "enforce-delete-depth-bomb": ("enforce", "proxy", "DELETE", "/api/v1/namespaces/{ns}/configmaps/x",
                                  b.YAML, b.yaml_depth_bomb(100_000)),
    "strict-create-json-depth-bomb": ("strict", "proxy", "POST", "/api/v1/namespaces/{ns}/configmaps",
                                      b.JSON, b.json_depth_bomb(100_000)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bomb_is_bounded(
    case: str,
    capped_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    twins: Twins,
) -> None:
    policy, credentials, method, target, ctype, body = CASES[case]
    rp = capped_factory(credentials=credentials, tls=credentials != "proxy", extra={"filters": POLICY_FILTERS[policy]})
    ctx = control_plane.ssl_context(client_cert=False)
    direct_ep = Endpoint("127.0.0.1", control_plane.apiserver_port,
                         ctx if credentials == "forward" else control_plane.ssl_context())  # fmt: skip
    if rp.ca_file:
        ctx.load_verify_locations(str(rp.ca_file))
    via_ep = Endpoint.from_url(rp.url, ctx if rp.ca_file else None)
    raw = request_bytes(method, target.format(ns=twins.via), [("Content-Type", ctype), ("Accept", "application/json")],
                        body)  # fmt: skip
    direct = exchange(direct_ep, raw)
    rss_before = _rss(rp)

    answer: list[Answer] = []
    sender = threading.Thread(target=lambda: answer.append(exchange(via_ep, raw, timeout=20)))
    sender.start()
    # Another caller meanwhile: its cheap request must not wait for the bomb.
    started = time.monotonic()
    other = exchange(via_ep, request_bytes("GET", "/version", []), timeout=20)
    stalled = time.monotonic() - started
    sender.join(30)
    via = answer[0] if answer else Answer(0, error="no answer in 30 s")

    detail = f"kproxy {via.short()}; apiserver {direct.short()}; raw={raw[:200]!r}... ({len(raw)} bytes)"
    assert rp.proc.poll() is None, f"kproxy exited; {detail}"
    assert other.status == 200 and stalled < STALL_LIMIT, f"another caller waited {stalled:.2f}s; {detail}"
    assert _rss(rp) - rss_before < 128 << 20, f"kproxy grew by {(_rss(rp) - rss_before) >> 20} MiB; {detail}"
    assert via.status == direct.status and via.is_status(), detail
    assert "Traceback" not in rp.log_text()
