"""The one discovery reader: the aggregated and the legacy forms give the same resources."""

from __future__ import annotations

import asyncio
from typing import Any

from kproxy.core.discovery import ServedResource, read_discovery

_AGGREGATED: dict[str, Any] = {
    "/api": {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {
                "metadata": {},
                "versions": [
                    {
                        "version": "v1",
                        "resources": [
                            {
                                "resource": "pods",
                                "responseKind": {"group": "", "version": "v1", "kind": "Pod"},
                                "scope": "Namespaced",
                                "singularResource": "pod",
                                "shortNames": ["po"],
                                "verbs": ["get", "list", "watch"],
                                "subresources": [{"subresource": "status", "verbs": ["get"]}],
                            }
                        ],
                    }
                ],
            }
        ],
    },
    "/apis": {
        "kind": "APIGroupDiscoveryList",
        "items": [
            {
                "metadata": {"name": "example.com"},
                # Versions in descending order of preference: the first is the preferred one.
                "versions": [
                    {
                        "version": "v2",
                        "resources": [
                            {
                                "resource": "widgets",
                                "responseKind": {"kind": "Widget"},
                                "scope": "Cluster",
                                "singularResource": "widget",
                                "verbs": ["list", "watch"],
                            }
                        ],
                    },
                    {
                        "version": "v1",
                        "resources": [
                            {
                                "resource": "widgets",
                                "responseKind": {"kind": "Widget"},
                                "scope": "Cluster",
                                "singularResource": "widget",
                                "verbs": ["list"],
                            }
                        ],
                    },
                ],
            }
        ],
    },
}

_LEGACY: dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/api/v1": {
        "resources": [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get", "list", "watch"],
                "shortNames": ["po"],
            },
            {"name": "pods/status", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        ]
    },
    "/apis": {
        "kind": "APIGroupList",
        "groups": [
            {
                "name": "example.com",
                "versions": [
                    {"groupVersion": "example.com/v2", "version": "v2"},
                    {"groupVersion": "example.com/v1", "version": "v1"},
                ],
                "preferredVersion": {"groupVersion": "example.com/v2", "version": "v2"},
            }
        ],
    },
    "/apis/example.com/v2": {
        "resources": [
            {
                "name": "widgets",
                "singularName": "widget",
                "namespaced": False,
                "kind": "Widget",
                "verbs": ["list", "watch"],
            }
        ]
    },
    "/apis/example.com/v1": {
        "resources": [
            {"name": "widgets", "singularName": "widget", "namespaced": False, "kind": "Widget", "verbs": ["list"]}
        ]
    },
}

EXPECTED = [
    ServedResource("", "v1", "pods", True, True, "Pod", ("get", "list", "watch"), "pod", ("po",), ("status",)),
    ServedResource("example.com", "v2", "widgets", True, False, "Widget", ("list", "watch"), "widget"),
    ServedResource("example.com", "v1", "widgets", False, False, "Widget", ("list",), "widget"),
]


def test_the_aggregated_and_the_legacy_form_give_the_same_resources_in_priority_order() -> None:
    for docs in (_AGGREGATED, _LEGACY):

        async def fetch(path: str, accept: str, docs: dict[str, Any] = docs) -> tuple[int, Any]:
            return 200, docs[path]

        assert asyncio.run(read_discovery(fetch)) == EXPECTED
    assert [r.list_watch for r in EXPECTED] == [True, True, False]
    assert list(EXPECTED[0].labels()) == ["pods", "pods/status"]
