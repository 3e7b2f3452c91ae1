"""`upstream.anonymous_auth: false`: callers without credentials get the apiserver's 401 where
kproxy decides who the caller is (impersonate mode; forward mode's cached reads).

An apiserver with anonymous auth off answers a request without credentials with the same 401
Status it gives a rejected token (its unauthorized handler does not tell them apart). The control
plane here keeps anonymous auth on, so the expected answer is taken from the apiserver itself with
a rejected token; and the default (`true`) is checked to keep the anonymous user's own 403.
Without the setting, impersonate mode would impersonate `system:anonymous` with kproxy's own right
to impersonate, which the apiserver grants even when its anonymous auth is off.
"""

from __future__ import annotations

from collections.abc import Callable

from rawhttp import get_json

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

OFF = {"upstream": {"anonymous_auth": False}}


def _rejected(control_plane: ControlPlaneInfo, path: str) -> tuple[int, dict[str, object]]:
    answer = get_json(control_plane.server + path, control_plane.ca_file, "not-a-valid-token")
    assert answer[0] == 401 and answer[1]["reason"] == "Unauthorized"
    return answer


def test_impersonate_mode_answers_callers_without_credentials_with_401(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo
) -> None:
    path = "/api/v1/namespaces"
    off = proxy_factory(credentials="impersonate", tls=True, extra=OFF)
    assert get_json(off.url + path, off.ca_file) == _rejected(control_plane, path)
    # Callers with credentials are unaffected: the ordinary user's own 403, as directly.
    direct = get_json(control_plane.server + path, control_plane.ca_file, control_plane.user_token)
    assert direct[0] == 403
    assert get_json(off.url + path, off.ca_file, control_plane.user_token) == direct

    # The default: the anonymous user, exactly as directly.
    on = proxy_factory(credentials="impersonate", tls=True)
    anonymous = get_json(control_plane.server + path, control_plane.ca_file)
    assert anonymous[0] == 403 and 'User "system:anonymous"' in str(anonymous[1]["message"])
    assert get_json(on.url + path, on.ca_file) == anonymous


def test_forward_mode_cached_reads_without_credentials_get_401(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo
) -> None:
    cached = "/api/v1/configmaps?resourceVersion=0"
    filters = [{"name": "watchcache", "resources": ["configmaps"]}]
    off = proxy_factory(credentials="forward", tls=True, extra={**OFF, "filters": filters})
    eventually(
        lambda: get_json(off.url + cached, off.ca_file, control_plane.admin_token)[0] == 200,
        30,
        "the configmaps cache to answer",
    )
    assert get_json(off.url + cached, off.ca_file) == _rejected(control_plane, cached)
    # Passed-through requests carry no credentials upstream either: the apiserver answers them.
    version = get_json(control_plane.server + "/version", control_plane.ca_file)
    assert get_json(off.url + "/version", off.ca_file) == version

    on = proxy_factory(credentials="forward", tls=True, extra={"filters": filters})
    eventually(
        lambda: get_json(on.url + cached, on.ca_file, control_plane.admin_token)[0] == 200,
        30,
        "the configmaps cache to answer",
    )
    anonymous = get_json(control_plane.server + cached, control_plane.ca_file)
    assert anonymous[0] == 403
    assert get_json(on.url + cached, on.ca_file) == anonymous
