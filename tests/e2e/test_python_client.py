"""The official Kubernetes Python client through kproxy: CRUD, list, watch and errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


@pytest.fixture
def core(proxy: RunningProxy) -> Iterator[client.CoreV1Api]:
    cfg = client.Configuration()
    cfg.host = proxy.url
    with client.ApiClient(cfg) as api:
        yield client.CoreV1Api(api)


def test_crud_and_list(core: client.CoreV1Api, kubectl: Kubectl, namespace: str) -> None:
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py"), data={"a": "1"})
    created = core.create_namespaced_config_map(namespace, body)
    assert created.metadata.resource_version
    got = core.read_namespaced_config_map("py", namespace)
    assert got.data == {"a": "1"}
    direct = kubectl.json(["get", "cm", "py", "-n", namespace])
    assert direct["metadata"]["resourceVersion"] == got.metadata.resource_version
    core.patch_namespaced_config_map("py", namespace, {"data": {"b": "2"}})
    names = [cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items]
    assert "py" in names
    core.delete_namespaced_config_map("py", namespace)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("py", namespace)
    assert err.value.status == 404
    assert '"reason":"NotFound"' in err.value.body


def test_watch_streams_events(core: client.CoreV1Api, kubectl: Kubectl, namespace: str) -> None:
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def run() -> None:
        for ev in w.stream(core.list_namespaced_config_map, namespace, timeout_seconds=30):
            seen.append((ev["type"], ev["object"].metadata.name))
            if ev["object"].metadata.name == "last":
                w.stop()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    kubectl(["create", "configmap", "first", "-n", namespace])
    eventually(lambda: ("ADDED", "first") in seen, 15, "the first event while the watch is open")
    kubectl(["create", "configmap", "last", "-n", namespace])
    t.join(15)
    assert ("ADDED", "last") in seen


def test_forbidden_for_user_without_bindings(
    forward_proxy: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cfg = client.Configuration()
    cfg.host = forward_proxy.url
    cfg.ssl_ca_cert = str(forward_proxy.ca_file)
    cfg.api_key = {"authorization": control_plane.user_token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    with client.ApiClient(cfg) as api, pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_pod(namespace)
    assert err.value.status == 403
    assert f'User \\"{control_plane.user_name}\\" cannot list resource \\"pods\\"' in err.value.body
