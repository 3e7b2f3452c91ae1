"""The chart's node-local (daemonset) mode keeps the watch cache on the node's disk when asked:
a hostPath made kproxy's by an init container with only CHOWN and FOWNER, mounted at the
watchcache filter's persist.dir; the gateway never mounts one, and the config must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import CASES, CHART, Helm, config_of, ensure_helm, kinds

from kproxy.config import parse_config


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(), tmp_path_factory.mktemp("helm"))


DIR = "/var/lib/kproxy/watchcache"
PERSISTED = {
    **CASES["daemonset"],
    "persistence": {"enabled": True},
    "config": {"filters": [{"name": "watchcache", "resources": ["pods"], "persist": {"dir": DIR}}]},
}


def test_daemonset_mounts_a_private_host_directory(chart: Helm, tmp_path: Path) -> None:
    docs = chart.template(PERSISTED)
    pod: dict[str, Any] = kinds(docs)["DaemonSet"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kproxy-state"]
    assert volume["hostPath"] == {"path": DIR, "type": "DirectoryOrCreate"}
    (container,) = pod["containers"]
    assert {"name": "kproxy-state", "mountPath": DIR} in container["volumeMounts"]
    assert container["securityContext"]["runAsNonRoot"] is True
    (init,) = pod["initContainers"]
    sc = init["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert init["command"][-3:] == [DIR, "65532", "65532"]
    # The rendered config is one kproxy accepts.
    cfg = config_of(docs)
    (tmp_path / "kproxy.yaml").write_text(yaml.safe_dump(cfg))
    parse_config(cfg)


def test_encryption_key_from_a_secret(chart: Helm) -> None:
    values = {**PERSISTED, "persistence": {"enabled": True, "keySecretName": "kproxy-persist-key"}}
    pod = kinds(chart.template(values))["DaemonSet"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "kproxy-persist-key"]
    assert volume["secret"]["secretName"] == "kproxy-persist-key" and volume["secret"]["defaultMode"] == 0o400
    (container,) = pod["containers"]
    assert {"name": "kproxy-persist-key", "mountPath": "/etc/kproxy-persist", "readOnly": True} in container[
        "volumeMounts"
    ]


def test_gateway_and_default_mount_no_host_directory(chart: Helm) -> None:
    for case in ("defaults", "daemonset"):
        docs = chart.template(CASES[case])
        for kind in ("Deployment", "DaemonSet"):
            if kind in kinds(docs):
                pod = kinds(docs)[kind]["spec"]["template"]["spec"]
                assert "initContainers" not in pod and not [v for v in pod["volumes"] if "hostPath" in v]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({**CASES["gateway"], "persistence": {"enabled": True}}, "daemonset mode only"),
        ({**PERSISTED, "config": {"filters": [{"name": "watchcache", "resources": ["pods"]}]}}, "persist.dir"),
    ],
)
def test_refused(chart: Helm, values: dict[str, Any], message: str) -> None:
    proc = chart.run("template", "kp", str(CHART), "--values", chart._values_file(values), check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
