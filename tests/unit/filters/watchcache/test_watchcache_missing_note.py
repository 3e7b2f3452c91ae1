"""A configured resource discovery lacks is named with the served resource it most likely meant."""

from __future__ import annotations

from typing import Any

from kproxy.filters.watchcache.resources import _Served, missing_note


def served(group: str, name: str, **entry: Any) -> _Served:
    return _Served(group, "v1", True, {"name": name, **entry})


SERVED = [
    served("", "pods", singularName="pod", kind="Pod", shortNames=["po"]),
    served("", "configmaps", singularName="configmap", kind="ConfigMap", shortNames=["cm"]),
    served("apps", "deployments", singularName="deployment", kind="Deployment", shortNames=["deploy"]),
    served("example.com", "widgets", singularName="widget", kind="Widget"),
]


def test_singular_short_names_and_kinds_point_at_the_plural() -> None:
    assert missing_note("pod", SERVED) == '"pod" (did you mean "pods"?)'
    assert missing_note("cm", SERVED) == '"cm" (did you mean "configmaps"?)'
    assert missing_note("Deployment", SERVED) == '"Deployment" (did you mean "deployments.apps"?)'
    assert missing_note("deployment.apps", SERVED) == '"deployment.apps" (did you mean "deployments.apps"?)'


def test_a_close_spelling_is_suggested_and_a_far_one_is_not() -> None:
    assert missing_note("configmpas", SERVED) == '"configmpas" (did you mean "configmaps"?)'
    assert missing_note("widgetz.example.com", SERVED) == '"widgetz.example.com" (did you mean "widgets.example.com"?)'
    assert missing_note("gadgets.example.com", SERVED) == '"gadgets.example.com"'
    # A group that is not served: nothing in it to suggest.
    assert missing_note("pod.nowhere.io", SERVED) == '"pod.nowhere.io"'
