"""The Helm chart (deploy/helm/kproxy) and the sidecar example, with the real helm and apiserver.

helm is built from its Go module (tools/helm) and cached like the control plane; every mode is
linted and rendered, every rendered manifest is sent to the real kube-apiserver with
``kubectl apply --dry-run=server`` in a namespace that warns on the ``restricted`` Pod Security
level (so a pod template that is not restricted-clean shows up as a warning and fails the test),
the RBAC rendered for a config is applied for real and probed with ``kubectl auth can-i``, and
values.schema.json is shown to reject bad values (its ``config`` part generated from kproxy's
own models by tools/gen_chart_schema.py, and refusing what kproxy refuses). The chart installs
with its default values (a generated serving certificate, checked by a real kproxy serving it),
and the sidecar example is a real chart dependency with kproxy as a native sidecar.
"""

from __future__ import annotations

import base64
import fcntl
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kproxy.config import Config, ConfigError, format_validation_error, parse_config
from kproxy.filters import lookup
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import start_proxy

# A cold helm build takes about 4 minutes on the 2-core machine; `make test` builds it first
# (`make helm-bin`), the fixture only builds it when run without make.
pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kproxy"
SIDECAR_EXAMPLE = REPO / "deploy" / "helm" / "examples" / "app-with-sidecar"
HELM_TOOL = REPO / "tools" / "helm"
SCHEMA_TOOL = REPO / "tools" / "gen_chart_schema.py"
# The chart's default rbac.impersonateExtras, as RBAC resources (no wildcard matches a subresource).
DEFAULT_EXTRAS = [
    f"userextras/authentication.kubernetes.io/{key}"
    for key in ("credential-id", "pod-name", "pod-uid", "node-name", "node-uid")
]


# --------------------------------------------------------------------------- helm binary


def helm_version() -> str:
    m = re.search(r"^\s*(?:require\s+)?helm\.sh/helm/v4\s+(v\S+)", (HELM_TOOL / "go.mod").read_text(), re.MULTILINE)
    assert m, "no helm.sh/helm/v4 pin in tools/helm/go.mod"
    return m.group(1)


def ensure_helm() -> Path:
    """$KPROXY_HELM_BIN, else ~/.cache/kproxy/helm/<pin>/helm, built (under a lock) if missing."""
    if override := os.environ.get("KPROXY_HELM_BIN"):
        return Path(override)
    version = helm_version()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kproxy" / "helm" / version
    binary = cache / "helm"

    def ready() -> bool:
        version_file = cache / "VERSION"
        return os.access(binary, os.X_OK) and version_file.is_file() and version_file.read_text().strip() == version

    if not ready():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{cache}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not ready():
                subprocess.run(["bash", str(HELM_TOOL / "build.sh"), str(cache)], check=True)
    return binary


@dataclass(frozen=True)
class Helm:
    binary: Path
    home: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        proc = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def template(
        self,
        values: dict[str, Any],
        namespace: str = "kproxy",
        chart: Path = CHART,
        release: str = "kp",
        *extra: str,
    ) -> list[dict[str, Any]]:
        values_args = ["--values", self._values_file(values)] if values else []
        proc = self.run("template", release, str(chart), "-n", namespace, *values_args, *extra)
        return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]

    def _values_file(self, values: dict[str, Any]) -> str:
        path = self.home / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return str(path)


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(), tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def sidecar_example(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example chart with its kproxy dependency packaged by `helm dependency build`, as a
    user runs it (offline: a file:// repository), in a copy of the two charts' layout."""
    root = tmp_path_factory.mktemp("charts")
    shutil.copytree(CHART, root / "kproxy")
    example = root / "examples" / SIDECAR_EXAMPLE.name
    shutil.copytree(SIDECAR_EXAMPLE, example, ignore=shutil.ignore_patterns("charts"))
    helm.run("dependency", "build", str(example))
    assert [p.name for p in (example / "charts").iterdir()] == ["kproxy-0.1.0.tgz"]
    return example


# --------------------------------------------------------------------------- the cases

WATCHCACHE = {
    "name": "watchcache",
    "resources": ["pods", "deployments.apps", "batch/v1/jobs", "replicasets.apps"],
}

#: Every mode and option worth rendering: name -> values.
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gateway": {"tls": {"secretName": "kproxy-tls"}},
    "gateway-cert-manager": {
        "tls": {"generate": "certManager", "certManager": {"issuerRef": {"name": "ca", "kind": "ClusterIssuer"}}},
    },
    "gateway-full": {
        "tls": {"secretName": "kproxy-tls"},
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": None, "minAvailable": 1},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {
            "enabled": True,
            "from": [{"namespaceSelector": {"matchLabels": {"team": "platform"}}}],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "apiserver": {"cidrs": ["10.0.0.1/32"], "ports": [6443]},
        },
        "config": {"credentials": "impersonate", "filters": [WATCHCACHE, {"name": "validation"}]},
    },
    "gateway-impersonate": {
        "tls": {"secretName": "kproxy-tls", "clientCASecretName": "kproxy-client-ca"},
        "config": {"credentials": "impersonate", "filters": [{"name": "validation"}, {"name": "dryrun", "rules": []}]},
    },
    "gateway-impersonate-groups": {
        "tls": {"secretName": "kproxy-tls", "clientCASecretName": "kproxy-client-ca"},
        "rbac": {
            "impersonateGroups": ["devs", "ops"],
            "metricsReaders": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
        },
        "config": {"credentials": "impersonate"},
    },
    "gateway-proxy": {
        "config": {"credentials": "proxy", "allow_remote": True, "proxy": {"accept_hosts": [r"^kp-kproxy\.kproxy"]}},
        "tls": {"secretName": "kproxy-tls"},
    },
    "daemonset": {"mode": "daemonset", "tls": {"allowPlaintext": True}},
    "sidecar": {"mode": "sidecar", "config": {"credentials": "proxy"}},
}


#: Configs kproxy refuses at start-up, so the chart must refuse them at install:
#: (config, what helm's schema error says, what kproxy's error says).
CONFIG_REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    (
        {"credentails": "proxy"},
        "at '/config': additional properties 'credentails' not allowed",
        "credentails: unknown key",
    ),
    ({"credentials": "root"}, "at '/config/credentials'", "credentials: must be one of"),
    (
        {"filters": [{"name": "watchcach", "resources": ["pods"]}]},
        "at '/config/filters/0/name': value must be one of 'compression', 'dryrun', 'transcode', 'validation', "
        "'watchcache'",
        "unknown filter 'watchcach'",
    ),
    (
        {"filters": [{"name": "transcode", "upstrem": "json"}]},
        "at '/config/filters/0': additional properties 'upstrem' not allowed",
        "upstrem",
    ),
    (
        {"filters": [{"name": "transcode", "upstream": "xml"}]},
        "at '/config/filters/0/upstream': value must be one of 'json', 'protobuf', 'auto'",
        "upstream",
    ),
    ({"filters": [{"name": "watchcache"}]}, "at '/config/filters/0': missing property 'resources'", "resources"),
    (
        {"filters": [{"name": "watchcache", "resources": ["apps/deployments"]}]},
        "at '/config/filters/0/resources/0'",
        "use GROUP/VERSION/RESOURCE or v1/RESOURCE",
    ),
    (
        {"filters": [{"name": "dryrun", "rules": [{"action": "maybe"}]}]},
        "at '/config/filters/0/rules/0/action'",
        "action",
    ),
    (
        {"filters": [{"name": "compression", "encodings": ["gzip", "gzip"]}]},
        "at '/config/filters/0/encodings'",
        "each encoding may be listed once",
    ),
    ({"filters": [{"name": "validation", "refresh_seconds": 0}]}, "at '/config/filters/0/refresh_seconds'", "refresh"),
    ({"log": {"level": "verbose"}}, "at '/config/log/level'", "log.level: must be one of"),
    ({"shutdown_timeout": "soon"}, "at '/config/shutdown_timeout'", "shutdown_timeout"),
    ({"upstream": {"max_connections": -1}}, "at '/config/upstream/max_connections'", "upstream.max_connections"),
    ({"connections": {"idle_timeout": "1d"}}, "at '/config/connections/idle_timeout'", "connections.idle_timeout"),
]


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs}


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(kinds(docs)["ConfigMap"]["data"]["kproxy.yaml"])
    return cfg


# --------------------------------------------------------------------------- lint and template


def test_helm_is_built_from_the_pinned_module(helm: Helm) -> None:
    out = helm.run("version", "--short").stdout
    assert out.startswith(helm_version()), out


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_strict(helm: Helm, case: str) -> None:
    values = helm._values_file(CASES[case])
    out = helm.run("lint", "--strict", str(CHART), "--values", values).stdout
    assert "0 chart(s) failed" in out


def test_lint_sidecar_example(helm: Helm, sidecar_example: Path) -> None:
    assert "0 chart(s) failed" in helm.run("lint", "--strict", str(sidecar_example)).stdout


def test_sidecar_example_is_a_real_dependency() -> None:
    """Not a symlink into the tree: Chart.yaml names the chart and `helm dependency build` packages it."""
    assert not (SIDECAR_EXAMPLE / "charts" / "kproxy").is_symlink()
    chart = yaml.safe_load((SIDECAR_EXAMPLE / "Chart.yaml").read_text())
    assert chart["dependencies"] == [{"name": "kproxy", "version": "0.1.0", "repository": "file://../../kproxy"}]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["version"] == "0.1.0"


def test_modes_render_their_workloads(helm: Helm) -> None:
    gateway = kinds(helm.template(CASES["gateway-full"]))
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= set(gateway)
    assert {"NetworkPolicy", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= set(gateway)
    assert "replicas" not in gateway["Deployment"]["spec"]  # the HPA owns it
    spread = gateway["Deployment"]["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]

    daemonset = kinds(helm.template(CASES["daemonset"]))
    assert "DaemonSet" in daemonset and "Deployment" not in daemonset
    assert daemonset["Service"]["spec"]["internalTrafficPolicy"] == "Local"
    assert "topologySpreadConstraints" not in daemonset["DaemonSet"]["spec"]["template"]["spec"]

    sidecar_docs = helm.template(CASES["sidecar"])
    sidecar = kinds(sidecar_docs)
    # Proxy mode, no filters: only the reviews of an authorized /metrics (the admin listener is on
    # every address, for the kubelet's probes), and the role that may read it.
    assert set(sidecar) == {"ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    assert rules_of(sidecar_docs) == REVIEWS
    assert config_of(list(sidecar.values()))["listen"] == "127.0.0.1:8443"


def test_pod_is_locked_down(helm: Helm) -> None:
    pod = kinds(helm.template(CASES["gateway"]))["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The token reaches the kproxy container only, through the projected volume.
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/var/run/secrets/kubernetes.io/serviceaccount"] == "kproxy-token"
    # The admin listener serves the API listener's certificate (admin_tls): the probes use HTTPS.
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "kproxy-admin", "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "kproxy-admin", "scheme": "HTTPS"}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "kproxy-admin", "scheme": "HTTPS"}
    # Readiness follows the apiserver's: an apiserver restart of up to 30 s keeps the endpoints.
    readiness = container["readinessProbe"]
    assert readiness["failureThreshold"] * readiness["periodSeconds"] >= 30
    # A rolling update drains: kproxy keeps serving while the endpoints are withdrawn.
    assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}


def test_standard_labels(helm: Helm) -> None:
    for doc in helm.template(CASES["gateway"]):
        labels = doc["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "kproxy-0.1.0", doc["kind"]
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "kp" and labels["app.kubernetes.io/name"] == "kproxy"


def test_config_checksum_rolls_pods_only_when_config_changes(helm: Helm) -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = kinds(helm.template(values))["Deployment"]
        value: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return value

    base = CASES["gateway"]
    assert checksum(base) == checksum({**base, "replicaCount": 5})
    assert checksum(base) != checksum({**base, "config": {"credentials": "forward", "log": {"level": "debug"}}})


def test_hot_reload_instead_of_restart(helm: Helm) -> None:
    values = {**CASES["gateway"], "restartOnConfigChange": False}
    annotations = kinds(helm.template(values))["Deployment"]["spec"]["template"]["metadata"].get("annotations") or {}
    assert "checksum/config" not in annotations


def test_client_ca_for_impersonate_mode(helm: Helm) -> None:
    docs = helm.template(CASES["gateway-impersonate"])
    assert config_of(docs)["tls"]["client_ca_file"] == "/etc/kproxy-client-ca/ca.crt"
    pod = kinds(docs)["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kproxy-client-ca"]["secret"]["secretName"] == "kproxy-client-ca"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["kproxy-client-ca"] == "/etc/kproxy-client-ca"


# --------------------------------------------------------------------------- the default install's certificate


def _secret_data(docs: list[dict[str, Any]]) -> dict[str, bytes]:
    secret = kinds(docs)["Secret"]
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def test_default_values_render_a_serving_certificate_for_the_service(helm: Helm) -> None:
    """No values at all: a kubernetes.io/tls Secret the chart made, mounted and named in the
    config, holding a certificate for the Service's names signed by the ca.crt next to it."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    docs = helm.template({}, "team-a")
    secret = kinds(docs)["Secret"]
    assert (secret["type"], secret["metadata"]["name"]) == ("kubernetes.io/tls", "kp-kproxy-tls")
    assert config_of(docs)["tls"] == {"cert_file": "/etc/kproxy-tls/tls.crt", "key_file": "/etc/kproxy-tls/tls.key"}
    volumes = {v["name"]: v for v in kinds(docs)["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kproxy-tls"]["secret"]["secretName"] == "kp-kproxy-tls"
    data = _secret_data(docs)
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    service = kinds(docs)["Service"]["metadata"]["name"]
    assert names == [service, f"{service}.team-a", f"{service}.team-a.svc", f"{service}.team-a.svc.cluster.local"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku


def _https_get(port: int, server_name: str, ca_file: Path, path: str, token: str) -> tuple[int, bytes]:
    """GET over TLS to 127.0.0.1:port, verifying the certificate for ``server_name`` (as a client
    in the cluster reaching the Service by that name would)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        request = f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\nAuthorization: Bearer {token}\r\n"
        tls.sendall((request + "Connection: close\r\n\r\n").encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_generated_certificate_served_by_kproxy(
    helm: Helm, control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    """kproxy serving the default install's certificate: a client that trusts the Secret's
    ca.crt and dials the Service's name gets through to the apiserver; another name is refused."""
    docs = helm.template({}, namespace)
    data = _secret_data(docs)
    files = {}
    for key in ("tls.crt", "tls.key", "ca.crt"):
        files[key] = tmp_path / key
        files[key].write_bytes(data[key])
    rendered = config_of(docs)
    rp = start_proxy(
        tmp_path / "kproxy",
        control_plane.admin_kubeconfig,
        credentials=rendered["credentials"],
        extra={"tls": {"cert_file": str(files["tls.crt"]), "key_file": str(files["tls.key"])}},
    )
    try:
        port = int(rp.url.rsplit(":", 1)[1])
        service = f"{kinds(docs)['Service']['metadata']['name']}.{namespace}.svc"
        code, body = _https_get(port, service, files["ca.crt"], "/version", control_plane.user_token)
        assert code == 200 and json.loads(body)["gitVersion"].startswith("v1."), body
        with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
            _https_get(port, f"other.{namespace}.svc", files["ca.crt"], "/version", control_plane.user_token)
    finally:
        rp.stop()


def test_generated_certificate_kept_across_upgrades(
    helm: Helm, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str
) -> None:
    """`helm install` with the default values, then `helm upgrade`: the apiserver holds the same
    certificate after the upgrade (the chart looked the Secret up), while a render that cannot
    look (`helm template`) makes a new one each time."""
    kubeconfig = ("--kubeconfig", str(control_plane.admin_kubeconfig))

    def stored() -> dict[str, str]:
        secret = json.loads(kubectl(["get", "secret", "kp-kproxy-tls", "-n", namespace, "-o", "json"]).stdout)
        data: dict[str, str] = secret["data"]
        return data

    helm.run("install", "kp", str(CHART), "-n", namespace, *kubeconfig)
    try:
        installed = stored()
        helm.run("upgrade", "kp", str(CHART), "-n", namespace, "--set", "replicaCount=3", *kubeconfig)
        assert stored() == installed
        assert kinds(helm.template({}, namespace))["Secret"]["data"]["tls.crt"] != installed["tls.crt"]
    finally:
        helm.run("uninstall", "kp", "-n", namespace, *kubeconfig)


def test_cert_manager_certificate_for_the_service(helm: Helm) -> None:
    docs = kinds(helm.template(CASES["gateway-cert-manager"], "team-a"))
    assert "Secret" not in docs
    cert = docs["Certificate"]
    assert cert["spec"]["secretName"] == "kp-kproxy-tls"
    assert cert["spec"]["dnsNames"][2] == "kp-kproxy.team-a.svc"
    assert cert["spec"]["issuerRef"] == {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    volumes = {v["name"]: v for v in docs["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kproxy-tls"]["secret"]["secretName"] == "kp-kproxy-tls"


def test_plaintext_or_own_secret_makes_no_certificate(helm: Helm) -> None:
    assert "Secret" not in kinds(helm.template(CASES["gateway"]))
    assert "Secret" not in kinds(helm.template(CASES["daemonset"]))
    assert "Secret" not in kinds(helm.template(CASES["sidecar"]))


@pytest.mark.parametrize("case", ["gateway", "gateway-impersonate", "gateway-proxy", "daemonset", "sidecar"])
def test_rendered_config_passes_kproxy_check_config(helm: Helm, case: str, tmp_path: Path) -> None:
    """The ConfigMap holds a config kproxy itself accepts (cases whose filters exist today)."""
    path = tmp_path / "kproxy.yaml"
    path.write_text(yaml.safe_dump(config_of(helm.template(CASES[case]))))
    out = subprocess.run(
        [sys.executable, "-m", "kproxy.cli", "check-config", str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


def test_sidecar_example_renders_app_with_kproxy(helm: Helm, sidecar_example: Path) -> None:
    docs = helm.template({}, "kproxy", sidecar_example, "demo", "--kube-version", "1.28.0")
    pod = kinds(docs)["Deployment"]["spec"]["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "kproxy"]
    assert "initContainers" not in pod["spec"]
    assert pod["spec"]["serviceAccountName"] == kinds(docs)["ServiceAccount"]["metadata"]["name"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    # The app has no token of its own: only kproxy's container mounts the service account.
    app, sidecar = pod["spec"]["containers"]
    assert not any("serviceaccount" in m["mountPath"] for m in app["volumeMounts"])
    assert any("serviceaccount" in m["mountPath"] for m in sidecar["volumeMounts"])
    maps = [d["data"] for d in docs if d["kind"] == "ConfigMap"]
    kubeconfig = next(yaml.safe_load(m["kubeconfig"]) for m in maps if "kubeconfig" in m)
    kproxy_cfg = next(yaml.safe_load(m["kproxy.yaml"]) for m in maps if "kproxy.yaml" in m)
    assert kproxy_cfg["listen"] == "127.0.0.1:8001"
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:8001"
    # The app's pods roll when kproxy's config changes.
    annotations = pod["metadata"]["annotations"]
    changed = helm.template(
        {"kproxy": {"config": {"credentials": "proxy", "log": {"level": "debug"}}}},
        "kproxy",
        sidecar_example,
        "demo",
        "--kube-version",
        "1.28.0",
    )
    assert kinds(changed)["Deployment"]["spec"]["template"]["metadata"]["annotations"] != annotations


def _sidecar_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = kinds(docs)["Deployment"]["spec"]["template"]["spec"]
    return pod


@pytest.mark.parametrize(
    ("kube_version", "native", "expect_native"),
    [("1.29.0", "auto", True), ("1.37.1", "auto", True), ("1.28.9", "auto", False), ("1.28.9", True, True)],
)
def test_native_sidecar_where_the_cluster_has_them(
    helm: Helm, sidecar_example: Path, kube_version: str, native: Any, expect_native: bool
) -> None:
    values = {"kproxy": {"sidecar": {"native": native}}}
    pod = _sidecar_pod(helm.template(values, "kproxy", sidecar_example, "demo", "--kube-version", kube_version))
    if expect_native:
        assert [c["name"] for c in pod["containers"]] == ["app"]
        (init,) = pod["initContainers"]
        assert init["name"] == "kproxy" and init["restartPolicy"] == "Always"
        assert init["startupProbe"]["httpGet"]["path"] == "/readyz"
    else:
        assert [c["name"] for c in pod["containers"]] == ["app", "kproxy"]
        assert "initContainers" not in pod and "restartPolicy" not in pod["containers"][1]


# --------------------------------------------------------------------------- the real apiserver


def _minimal_crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def servicemonitor_crd(control_plane: ControlPlaneInfo, kubectl: Kubectl) -> Iterator[None]:
    """ServiceMonitor (prometheus-operator) and Certificate (cert-manager) are CRDs, absent from a
    bare apiserver: install minimal ones (group, kind, version, scope as the operators'; their
    schema preserves unknown fields, so the dry run checks the object's identity and metadata,
    not the operator's field schema)."""
    crds = [
        _minimal_crd("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
        _minimal_crd("cert-manager.io", "Certificate", "certificates"),
    ]
    kubectl(["apply", "-f", "-"], input="\n---\n".join(json.dumps(c) for c in crds))
    for crd in crds:
        kubectl(["wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s"])
    yield


@pytest.fixture
def restricted_namespace(namespace: str, kubectl: Kubectl) -> str:
    """The test namespace, warning on anything that breaks the `restricted` Pod Security level."""
    kubectl(["label", "namespace", namespace, "pod-security.kubernetes.io/warn=restricted"])
    return namespace


def dry_run(kubectl: Kubectl, docs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return kubectl(
        ["apply", "--dry-run=server", "-o", "name", "-f", "-"],
        input="\n---\n".join(yaml.safe_dump(d) for d in docs),
        check=False,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_manifest_accepted_by_the_apiserver(
    helm: Helm, kubectl: Kubectl, restricted_namespace: str, servicemonitor_crd: None, case: str
) -> None:
    docs = helm.template(CASES[case], namespace=restricted_namespace)
    out = dry_run(kubectl, docs)
    assert out.returncode == 0, out.stderr
    accepted = out.stdout.split()
    assert len(accepted) == len(docs), (accepted, [d["kind"] for d in docs])
    assert "Warning" not in out.stderr, out.stderr  # e.g. "would violate PodSecurity restricted"


@pytest.mark.parametrize("kube_version", ["1.37.1", "1.28.0"], ids=["native", "classic"])
def test_sidecar_example_accepted_by_the_apiserver(
    helm: Helm, kubectl: Kubectl, restricted_namespace: str, sidecar_example: Path, kube_version: str
) -> None:
    docs = helm.template({}, restricted_namespace, sidecar_example, "demo", "--kube-version", kube_version)
    out = dry_run(kubectl, docs)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == len(docs)
    assert "Warning" not in out.stderr, out.stderr


def test_native_sidecar_in_a_pod_and_a_job_accepted_by_the_apiserver(
    helm: Helm, kubectl: Kubectl, restricted_namespace: str, sidecar_example: Path
) -> None:
    """The native sidecar's pod spec as a bare Pod and as a Job's (restartPolicy: Never), the
    shape a Job needs to complete: the apiserver keeps the init container's restartPolicy:
    Always (what it would persist, from the dry run's answer)."""
    docs = helm.template({}, restricted_namespace, sidecar_example, "demo", "--kube-version", "1.37.1")
    spec = {**_sidecar_pod(docs), "restartPolicy": "Never"}
    meta = {"name": "demo-once", "namespace": restricted_namespace}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"backoffLimit": 0, "template": {"spec": spec}},
    }
    for obj in (pod, job):
        out = kubectl(["create", "--dry-run=server", "-o", "json", "-f", "-"], input=json.dumps(obj), check=False)
        assert out.returncode == 0, out.stderr
        assert "Warning" not in out.stderr, out.stderr
        persisted = json.loads(out.stdout)
        persisted_spec = persisted["spec"] if obj is pod else persisted["spec"]["template"]["spec"]
        (init,) = persisted_spec["initContainers"]
        assert (init["name"], init["restartPolicy"]) == ("kproxy", "Always")
        assert [c["name"] for c in persisted_spec["containers"]] == ["app"]


def test_restricted_warning_is_detected(kubectl: Kubectl, restricted_namespace: str) -> None:
    """The Pod Security check above can fail: a privileged pod template draws the warning."""
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bad", "namespace": restricted_namespace},
        "spec": {
            "selector": {"matchLabels": {"app": "bad"}},
            "template": {
                "metadata": {"labels": {"app": "bad"}},
                "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
            },
        },
    }
    out = dry_run(kubectl, [bad])
    assert out.returncode == 0
    assert 'would violate PodSecurity "restricted' in out.stderr


# --------------------------------------------------------------------------- RBAC from the config


def rules_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules of kproxy's own ClusterRole (not the metrics-reader role the chart also makes)."""
    roles = [d for d in docs if d["kind"] == "ClusterRole" and not d["metadata"]["name"].endswith("-metrics-reader")]
    return list(roles[0]["rules"]) if roles else []


#: What an authorized /metrics needs (and forward or impersonate mode anyway).
REVIEWS = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]


def test_rbac_forward_mode(helm: Helm) -> None:
    rules = rules_of(helm.template(CASES["gateway"]))
    assert rules == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]


def test_rbac_watchcache_resource_forms(helm: Helm) -> None:
    def rules(resources: list[str]) -> list[dict[str, Any]]:
        watchcache = {"name": "watchcache", "resources": resources}
        config = {
            "credentials": "proxy",
            "allow_remote": True,
            "proxy": {"disable_filter": True},
            "filters": [watchcache],
        }
        return rules_of(helm.template({**CASES["gateway"], "config": config}))

    read = ["get", "list", "watch"]
    # (Then the reviews of an authorized /metrics: test_rbac_proxy_mode_needs_only_the_metrics_reviews.)
    assert rules(["v1/configmaps", "apps/v1/deployments", "secrets"]) == [
        {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": read},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": read},
        *REVIEWS,
    ]
    assert rules(["*"]) == [{"apiGroups": ["*"], "resources": ["*"], "verbs": read}, *REVIEWS]


def test_rbac_proxy_mode_needs_only_the_metrics_reviews(helm: Helm) -> None:
    """Proxy mode needs nothing for callers; an authorized /metrics (the default off loopback)
    needs token and access reviews; `metrics_access: anyone` needs nothing at all."""
    config = {**CASES["gateway-proxy"]["config"], "filters": [{"name": "dryrun", "rules": []}]}
    values = {**CASES["gateway-proxy"], "config": config}
    assert rules_of(helm.template(values)) == REVIEWS
    open_metrics = {**values, "config": {**config, "metrics_access": "anyone"}}
    docs = helm.template(open_metrics)
    assert rules_of(docs) == []
    assert not [d for d in docs if d["kind"] == "ClusterRole"]  # no metrics-reader role either
    extra = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    assert rules_of(helm.template({**open_metrics, "rbac": {"extraRules": [extra]}})) == [extra]


def test_rbac_validation_filter_in_proxy_mode(helm: Helm) -> None:
    """The validation filter's own calls: CRD list/watch (watch_crds), SubjectAccessReviews
    (local_strict), the OpenAPI documents; each switched off with its option."""
    proxy = {"mode": "sidecar", "config": {"credentials": "proxy", "metrics_access": "anyone"}}
    crds = {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["get", "list", "watch"],
    }
    sar = {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
    openapi = {"nonResourceURLs": ["/openapi/v2", "/openapi/v3", "/openapi/v3/*"], "verbs": ["get"]}

    def rules(**options: Any) -> list[dict[str, Any]]:
        values = {**proxy, "config": {**proxy["config"], "filters": [{"name": "validation", **options}]}}
        return rules_of(helm.template(values))

    assert rules() == [crds, sar, openapi]
    assert rules(watch_crds=False) == [sar, openapi]
    assert rules(local_strict=False) == [crds, openapi]
    assert rules(watch_crds=False, local_strict=False) == [openapi]


def test_rbac_impersonate_groups_by_name(helm: Helm) -> None:
    rules = rules_of(helm.template(CASES["gateway-impersonate-groups"]))
    assert rules == [
        *REVIEWS,
        {"apiGroups": [""], "resources": ["users", "serviceaccounts"], "verbs": ["impersonate"]},
        {
            "apiGroups": [""],
            "resources": ["groups"],
            "resourceNames": ["devs", "ops", "system:authenticated"],
            "verbs": ["impersonate"],
        },
        {"apiGroups": ["authentication.k8s.io"], "resources": ["uids", *DEFAULT_EXTRAS], "verbs": ["impersonate"]},
    ]


def test_metrics_are_authorized_and_scraped_over_tls(helm: Helm) -> None:
    """The default install: the admin listener serves the API listener's certificate and
    authorizes /metrics (kproxy's `auto` off loopback); the ServiceMonitor scrapes over HTTPS,
    verifying the certificate with the Secret's ca.crt, with Prometheus's own token."""
    docs = helm.template({**CASES["gateway"], "tls": {}, "serviceMonitor": {"enabled": True}}, "team-a")
    cfg = config_of(docs)
    assert cfg["admin_tls"] is True and cfg["admin_listen"] == "0.0.0.0:9099" and "metrics_access" not in cfg
    (endpoint,) = kinds(docs)["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint == {
        "port": "kproxy-admin",
        "path": "/metrics",
        "interval": "30s",
        "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "scheme": "https",
        "tlsConfig": {
            "ca": {"secret": {"name": "kp-kproxy-tls", "key": "ca.crt"}},
            "serverName": "kp-kproxy.team-a.svc",
        },
    }
    reader = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-metrics-reader")]
    assert [r["rules"] for r in reader] == [[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]]
    # Without TLS (plain HTTP on both listeners) the probes and the scrape use HTTP, still with a token.
    plain = helm.template({"mode": "daemonset", "tls": {"allowPlaintext": True}, "serviceMonitor": {"enabled": True}})
    assert "admin_tls" not in config_of(plain)
    (endpoint,) = kinds(plain)["ServiceMonitor"]["spec"]["endpoints"]
    assert "scheme" not in endpoint and endpoint["bearerTokenFile"]
    probe = kinds(plain)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTP"


def test_metrics_readers_may_get_metrics(helm: Helm, kubectl: Kubectl, namespace: str) -> None:
    """rbac.metricsReaders are bound to the metrics-reader role: the apiserver lets them get
    /metrics (kproxy's, and any component's: the right is one non-resource URL), nobody else."""
    reader = f"prometheus-{namespace}"
    values = {
        **CASES["gateway"],
        "rbac": {"metricsReaders": [{"kind": "User", "name": reader, "apiGroup": "rbac.authorization.k8s.io"}]},
    }
    docs = [d for d in helm.template(values, namespace=namespace) if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert len(docs) == 4
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in docs))
    try:

        def can_get_metrics(user: str) -> bool:
            return kubectl(["auth", "can-i", "get", "/metrics", f"--as={user}"], check=False).stdout.strip() == "yes"

        assert can_get_metrics(reader)
        assert not can_get_metrics(f"someone-else-{namespace}")
    finally:
        for d in docs:
            kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])


def test_rbac_impersonate_watchcache_validation(helm: Helm) -> None:
    rules = rules_of(helm.template(CASES["gateway-full"]))
    assert rules == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["users", "groups", "serviceaccounts"], "verbs": ["impersonate"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["uids", *DEFAULT_EXTRAS], "verbs": ["impersonate"]},
        {"nonResourceURLs": ["/openapi/v2", "/openapi/v3", "/openapi/v3/*"], "verbs": ["get"]},
    ]


@pytest.mark.parametrize(
    ("case", "allowed", "denied"),
    [
        (
            "gateway-full",
            [
                "list pods -A",
                "watch deployments.apps -A",
                "list jobs.batch -A",
                "create tokenreviews",
                "create subjectaccessreviews",
                "impersonate users",
                "impersonate serviceaccounts",
                "watch customresourcedefinitions",
            ],
            [
                "list secrets -A",
                "delete pods -A",
                "create pods -A",
                "list cronjobs.batch -A",
                "delete customresourcedefinitions",
            ],
        ),
        (
            "gateway",
            ["create tokenreviews", "create subjectaccessreviews"],
            ["impersonate users", "impersonate groups", "list pods -A", "get /metrics"],
        ),
        (
            # Groups by name: the apiserver refuses kproxy every other group, system:masters too.
            "gateway-impersonate-groups",
            [
                "impersonate groups/devs",
                "impersonate groups/ops",
                "impersonate groups/system:authenticated",
                "impersonate users/alice",
                "impersonate serviceaccounts -n default",
            ],
            [
                "impersonate groups/system:masters",
                "impersonate groups/system:nodes",
                "impersonate groups/admins",
                "impersonate groups",
                "get /metrics",
            ],
        ),
    ],
)
def test_rendered_rbac_grants_exactly_what_the_config_needs(
    helm: Helm,
    kubectl: Kubectl,
    namespace: str,
    case: str,
    allowed: list[str],
    denied: list[str],
) -> None:
    """Apply the rendered ServiceAccount and RBAC for real and ask the apiserver's authorizer."""
    docs = [
        d
        for d in helm.template(CASES[case], namespace=namespace)
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in docs))
    try:
        sa = f"system:serviceaccount:{namespace}:{kinds(docs)['ServiceAccount']['metadata']['name']}"

        def can_i(what: str) -> bool:
            out = kubectl(["auth", "can-i", *what.split(), f"--as={sa}"], check=False)
            return out.stdout.strip() == "yes"

        assert [w for w in allowed if not can_i(w)] == []
        assert [w for w in denied if can_i(w)] == []
    finally:
        for d in docs:
            if d["kind"] != "ServiceAccount":
                kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])


# --------------------------------------------------------------------------- values.schema.json


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"mode": "statefulset"}, "at '/mode': value must be one of 'gateway', 'daemonset', 'sidecar'"),
        ({"config": {"credentials": "root"}}, "at '/config/credentials'"),
        ({"config": {"filters": [{"resources": ["pods"]}]}}, "at '/config/filters/0': missing property 'name'"),
        *[({"config": config}, error) for config, error, _ in CONFIG_REFUSALS],
        ({"ports": {"proxy": 70000, "admin": 9099}}, "at '/ports/proxy': maximum"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        ({"image": {"repository": "x", "digest": "latest"}}, "at '/image/digest'"),
        ({"autoscaling": {"enabled": "yes"}}, "at '/autoscaling/enabled'"),
        ({"service": {"type": "ExternalName"}}, "at '/service/type'"),
        ({"serviceMonitor": {"interval": "often"}}, "at '/serviceMonitor/interval'"),
        ({"resources": {"requests": {"cpu": "lots"}}}, "at '/resources/requests/cpu'"),
        ({"config": {"proxy": {"reject_paths": [1]}}}, "at '/config/proxy/reject_paths'"),
        ({"tls": {"generate": "letsencrypt"}}, "at '/tls/generate'"),
        ({"sidecar": {"native": "yes"}}, "at '/sidecar/native'"),
        ({"rbac": {"metricsReaders": [{"kind": "Pod", "name": "x"}]}}, "at '/rbac/metricsReaders/0/kind'"),
        ({"rbac": {"impersonateGroups": [""]}}, "at '/rbac/impersonateGroups/0'"),
    ],
)
def test_values_schema_rejects_bad_values(helm: Helm, values: dict[str, Any], error: str) -> None:
    out = helm.run("template", "kp", str(CHART), "--values", helm._values_file(values), check=False)
    assert out.returncode != 0
    assert "don't meet the specifications of the schema" in out.stderr
    assert error in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"config": {"credentials": "proxy"}, "tls": {"secretName": "t"}}, "needs config.allow_remote: true"),
        ({"tls": {"generate": "none"}}, "set tls.secretName"),
        ({"tls": {"generate": "certManager"}}, "tls.generate: certManager needs tls.certManager.issuerRef.name"),
        (
            {"config": {"filters": [{"name": "dryrun", "rules": []}, {"name": "dryrun", "rules": []}]}},
            'config.filters[1]: filter "dryrun" is listed twice',
        ),
        ({"config": {"proxy": {"check_origin": False}}}, "config.proxy: applies only with config.credentials: proxy"),
        (
            {"config": {"credentials": "proxy", "allow_remote": True}, "tls": {"secretName": "t"}},
            "set config.proxy.accept_hosts to the names callers use",
        ),
        ({"mode": "sidecar", "networkPolicy": {"enabled": True}}, "give your chart its own NetworkPolicy"),
        (
            {
                "tls": {"secretName": "t"},
                "config": {"credentials": "impersonate"},
                "rbac": {"impersonateGroups": ["system:masters"]},
            },
            'rbac.impersonateGroups: "system:masters" is a privileged group kproxy refuses to impersonate',
        ),
        (
            {
                "tls": {"secretName": "t"},
                "config": {"credentials": "impersonate"},
                "rbac": {"impersonateGroups": ["devs", "kubeadm:cluster-admins"]},
            },
            'rbac.impersonateGroups: "kubeadm:cluster-admins" is a privileged group kproxy refuses to impersonate',
        ),
        (
            {
                "tls": {"secretName": "t"},
                "config": {"credentials": "impersonate"},
                "rbac": {"impersonateGroups": ["system:bootstrappers:kubeadm:default-node-token"]},
            },
            '"system:bootstrappers:kubeadm:default-node-token" is a privileged group kproxy refuses to impersonate',
        ),
        (
            {"tls": {"secretName": "t", "clientCASecretName": "ca"}},
            "client certificates identify callers only with config.credentials: impersonate",
        ),
        (
            {"tls": {"secretName": "t"}, "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}},
            "minReplicas is greater than autoscaling.maxReplicas",
        ),
    ],
)
def test_unsafe_combinations_fail_at_render(helm: Helm, values: dict[str, Any], error: str) -> None:
    out = helm.run("template", "kp", str(CHART), "--values", helm._values_file(values), check=False)
    assert out.returncode != 0
    assert error in out.stderr, out.stderr


def test_chart_schema_is_generated_from_kproxy_models() -> None:
    """values.schema.json's `config` is what tools/gen_chart_schema.py makes of the models today."""
    out = subprocess.run([sys.executable, str(SCHEMA_TOOL), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


def test_chart_schema_for_an_image_with_a_plugin_filter(helm: Helm, tmp_path: Path) -> None:
    """The committed schema knows the built-in filters only; `--plugins` regenerates it with the
    filters installed here (the example `readonly` plugin), checked against the plugin's model."""
    readonly = {"config": {"filters": [{"name": "readonly", "allow_namespaces": ["dev-*"]}]}}
    out = helm.run("template", "kp", str(CHART), "--values", helm._values_file(readonly), check=False)
    assert "at '/config/filters/0/name': value must be one of" in out.stderr, out.stderr
    chart = tmp_path / "kproxy"
    shutil.copytree(CHART, chart)
    schema = chart / "values.schema.json"
    subprocess.run([sys.executable, str(SCHEMA_TOOL), "--plugins", "--output", str(schema)], check=True)
    assert config_of(helm.template(readonly, chart=chart))["filters"] == readonly["config"]["filters"]
    typo = {"config": {"filters": [{"name": "readonly", "allow_namespace": ["dev-*"]}]}}
    out = helm.run("template", "kp", str(chart), "--values", helm._values_file(typo), check=False)
    assert "additional properties 'allow_namespace' not allowed" in out.stderr, out.stderr


def _kproxy_refusal(config: dict[str, Any]) -> str | None:
    """What kproxy says of ``config`` at start-up (kproxy.config and each filter's model), or None."""
    try:
        cfg = parse_config(config)
        for i, entry in enumerate(cfg.filters):
            model = lookup(entry.name).config_model
            try:
                model.model_validate(entry.settings)
            except ValidationError as err:
                return format_validation_error(err, f"filters[{i}]", model)
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize(("config", "error", "kproxy_says"), CONFIG_REFUSALS)
def test_kproxy_refuses_what_the_chart_refuses(config: dict[str, Any], error: str, kproxy_says: str) -> None:
    """Each config the chart's schema refuses (test_values_schema_rejects_bad_values) kproxy refuses too."""
    refusal = _kproxy_refusal(config)
    assert refusal is not None and kproxy_says in refusal, refusal


def _settings_in_full(name: str, required: dict[str, Any]) -> dict[str, Any]:
    """Every setting of a filter, at its default (the required ones given), as YAML would hold it."""
    settings: dict[str, Any] = lookup(name).config_model.model_validate(required).model_dump(mode="json")
    return {"name": name, **settings}


def test_chart_accepts_what_kproxy_accepts(helm: Helm) -> None:
    """config.example.yaml (every key, durations as "30s") and every built-in filter with all its
    settings spelled out: kproxy takes them, so the chart must."""
    example = yaml.safe_load((REPO / "config.example.yaml").read_text())
    example.pop("tls")  # null: the chart fills it in
    rule = {"name": "ci", "match": {"users": ["ci"], "verbs": ["create"]}}
    filters = [
        _settings_in_full("compression", {"encodings": ["gzip"]}),
        _settings_in_full("dryrun", {"rules": [{**rule, "action": "enforce"}]}),
        _settings_in_full("transcode", {"upstream": "auto"}),
        _settings_in_full("validation", {"rules": [{**rule, "level": "Strict"}]}),
        _settings_in_full(
            "watchcache", {"resources": ["pods", "deployments.apps", "batch/v1/jobs", "v1/secrets", "*"]}
        ),
    ]
    config = {**example, "filters": filters, "proxy": {**example["proxy"], "accept_hosts": "^localhost$,^kp$"}}
    assert _kproxy_refusal(config) is None
    docs = helm.template({"mode": "sidecar", "config": config})
    assert [f["name"] for f in config_of(docs)["filters"]] == [f["name"] for f in filters]


@pytest.mark.parametrize(
    "name",
    ["pods", "deployments.apps", "v1/pods", "v1/", "apps/v1/deployments", "//", "*", "Pods!", "", "apps/x", "a/b/c/d"],
)
def test_watchcache_resource_pattern_is_kproxys_parser(name: str) -> None:
    """The schema's pattern for watchcache resources (tools/gen_chart_schema.py) accepts exactly
    the names kproxy's parser does."""
    from kproxy.filters.watchcache.resources import parse_name

    spec = importlib.util.spec_from_file_location("gen_chart_schema", SCHEMA_TOOL)
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    try:
        parse_name(name)
        accepted = True
    except ValueError:  # the watchcache's own ConfigError
        accepted = False
    assert bool(re.search(tool.WATCHCACHE_RESOURCE_PATTERN, name)) is accepted


def test_schema_knows_every_credentials_mode_of_kproxy() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    modes = set(schema["properties"]["config"]["properties"]["credentials"]["enum"])
    annotation = Config.model_fields["credentials"].annotation
    assert set(annotation.__args__) <= modes  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the chart's pod, run


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            series, _, value = line.rpartition(" ")
            got = ",".join(sorted(series[len(name) + 1 : -1].split(",")))
            if got == want:
                total += float(value)
    return total


@pytest.mark.parametrize("rbac", [True, False], ids=["chart-rbac", "no-rbac"])
def test_chart_service_account_runs_the_validation_filter(
    helm: Helm, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path, rbac: bool
) -> None:
    """kproxy in-cluster as the chart's service account, with the chart's rendered RBAC and
    config (forward mode, the validation filter): its own TokenReview and SubjectAccessReview
    succeed, so it answers a Strict field-validation error itself. Without the chart's RBAC
    the reviews fail, and it leaves the answer to the apiserver (same reply, other outcome)."""
    values = {
        "tls": {"allowPlaintext": True},
        "rbac": {"create": rbac},
        "config": {"credentials": "forward", "filters": [{"name": "validation"}]},
    }
    docs = helm.template(values, namespace=namespace)
    rendered = config_of(docs)
    applied = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    assert ("ClusterRole" in kinds(applied)) is rbac
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in applied))
    # The caller (a plain user) may create ConfigMaps in the namespace.
    kubectl(["create", "role", "cm", "-n", namespace, "--verb=create", "--resource=configmaps"])
    kubectl(["create", "rolebinding", "cm", "-n", namespace, "--role=cm", f"--user={control_plane.user_name}"])
    try:
        sa = kinds(applied)["ServiceAccount"]["metadata"]["name"]
        sa_dir = tmp_path / "serviceaccount"
        sa_dir.mkdir()
        (sa_dir / "token").write_text(kubectl(["create", "token", sa, "-n", namespace]).stdout.strip())
        (sa_dir / "ca.crt").write_text(control_plane.ca_file.read_text())
        (sa_dir / "namespace").write_text(namespace)
        env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
            "KPROXY_SERVICE_ACCOUNT_DIR": str(sa_dir),
        }
        # The rendered config, on free loopback ports instead of the pod's 0.0.0.0:8443.
        rp = start_proxy(
            tmp_path / "kproxy",
            None,
            credentials=rendered["credentials"],
            extra={"filters": rendered["filters"]},
            env=env,
        )
        try:
            body = json.dumps(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}, "bogus": 1}
            ).encode()
            request = urllib.request.Request(
                f"{rp.url}/api/v1/namespaces/{namespace}/configmaps?fieldValidation=Strict",
                data=body,
                method="POST",
                headers={
                    "Authorization": f"Bearer {control_plane.user_token}",
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                },
            )

            def post() -> tuple[int, dict[str, Any]]:
                try:
                    with urllib.request.urlopen(request, timeout=10) as resp:
                        return resp.status, json.loads(resp.read())
                except urllib.error.HTTPError as err:
                    return err.code, json.loads(err.read())

            outcome = "rejected" if rbac else "deferred"

            def answered() -> bool:
                code, status = post()
                assert code == 400 and status["reason"] == "BadRequest", status
                assert 'unknown field "bogus"' in status["message"]
                return _metric(rp.metrics(), "kproxy_validation_requests_total", level="Strict", outcome=outcome) > 0

            eventually(answered, 60, f"a Strict error with outcome {outcome}")
            other = "deferred" if rbac else "rejected"
            assert _metric(rp.metrics(), "kproxy_validation_requests_total", level="Strict", outcome=other) == 0
        finally:
            rp.stop()
    finally:
        for d in applied:
            if d["kind"] != "ServiceAccount":
                kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])


@pytest.mark.parametrize("rbac_for", ["impersonate", "forward", "none"])
def test_chart_service_account_impersonates_callers(
    helm: Helm, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path, rbac_for: str
) -> None:
    """`credentials: impersonate` in-cluster as the chart's service account. With the RBAC the
    chart renders for that mode the apiserver sees the caller (a SelfSubjectReview through
    kproxy names the user, not kproxy). With the RBAC rendered for `forward` (token and access
    reviews, no impersonation) the apiserver refuses kproxy's impersonation; with none at all,
    kproxy cannot even review the caller's token."""
    values = {
        "tls": {"secretName": "unused"},
        "rbac": {"create": rbac_for != "none"},
        "config": {"credentials": "forward" if rbac_for == "forward" else "impersonate"},
    }
    docs = helm.template(values, namespace=namespace)
    applied = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in applied))
    try:
        sa = kinds(applied)["ServiceAccount"]["metadata"]["name"]
        sa_dir = tmp_path / "serviceaccount"
        sa_dir.mkdir()
        (sa_dir / "token").write_text(kubectl(["create", "token", sa, "-n", namespace]).stdout.strip())
        (sa_dir / "ca.crt").write_text(control_plane.ca_file.read_text())
        env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
            "KPROXY_SERVICE_ACCOUNT_DIR": str(sa_dir),
        }
        rp = start_proxy(tmp_path / "kproxy", None, credentials="impersonate", env=env)
        try:
            review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
            request = urllib.request.Request(
                f"{rp.url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                data=review,
                method="POST",
                headers={"Authorization": f"Bearer {control_plane.user_token}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    code, answer = resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as err:
                code, answer = err.code, json.loads(err.read())
            me = f"system:serviceaccount:{namespace}:{sa}"
            if rbac_for == "impersonate":
                assert code == 201, answer
                assert answer["status"]["userInfo"]["username"] == control_plane.user_name
            elif rbac_for == "forward":
                assert code == 403, answer["message"]
                assert f'is forbidden: User "{me}" cannot impersonate' in answer["message"]
            else:
                assert code == 500, answer["message"]
                assert (
                    f'TokenReview answered 403: tokenreviews.authentication.k8s.io is forbidden: User "{me}"'
                    in (answer["message"])
                )
        finally:
            rp.stop()
    finally:
        for d in applied:
            if d["kind"] != "ServiceAccount":
                kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])


def test_chart_rbac_refuses_system_masters_even_if_kproxy_would_not(
    helm: Helm, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The two refusals are independent. Here kproxy is told to act as system:masters
    (config.impersonate.allowed_privileged_groups) but the chart's RBAC lists the groups kproxy
    may impersonate (rbac.impersonateGroups, without it): the apiserver itself refuses the
    impersonation, and a caller certificate with O=system:masters creates nothing; one in a
    listed group is served as itself."""
    from kproxy.localcluster import certs

    values = {
        "tls": {"secretName": "unused", "clientCASecretName": "unused-ca"},
        "rbac": {"impersonateGroups": ["devs"]},
        "config": {"credentials": "impersonate", "impersonate": {"allowed_privileged_groups": ["system:masters"]}},
    }
    docs = helm.template(values, namespace=namespace)
    applied = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    kubectl(["apply", "-f", "-"], input="\n---\n".join(yaml.safe_dump(d) for d in applied))
    callers = certs.generate_ca("callers")
    try:
        sa = kinds(applied)["ServiceAccount"]["metadata"]["name"]
        sa_dir = tmp_path / "serviceaccount"
        sa_dir.mkdir()
        (sa_dir / "token").write_text(kubectl(["create", "token", sa, "-n", namespace]).stdout.strip())
        (sa_dir / "ca.crt").write_text(control_plane.ca_file.read_text())
        env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(control_plane.apiserver_port),
            "KPROXY_SERVICE_ACCOUNT_DIR": str(sa_dir),
        }
        client_ca = certs.write_pem(tmp_path / "callers.crt", callers.cert_pem, private=False)
        rendered = config_of(docs)
        rp = start_proxy(
            tmp_path / "kproxy",
            None,
            credentials="impersonate",
            tls=True,
            extra={"tls": {"client_ca_file": str(client_ca)}, "impersonate": rendered["impersonate"]},
            env=env,
        )
        try:

            def post(user: str, group: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                leaf = certs.generate_client_cert(callers, user, (group,))
                crt = certs.write_pem(tmp_path / f"{user}.crt", leaf.cert_pem, private=False)
                key = certs.write_pem(tmp_path / f"{user}.key", leaf.key_pem, private=True)
                ctx = ssl.create_default_context(cafile=str(rp.ca_file))
                ctx.load_cert_chain(str(crt), str(key))
                request = urllib.request.Request(
                    rp.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
                )
                try:
                    with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
                        return resp.status, json.loads(resp.read())
                except urllib.error.HTTPError as err:
                    return err.code, json.loads(err.read())

            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "by-masters"}}
            code, answer = post("eve", "system:masters", f"/api/v1/namespaces/{namespace}/configmaps", cm)
            me = f"system:serviceaccount:{namespace}:{sa}"
            assert code == 403, answer
            # The apiserver's refusal of the impersonation (v1.37 words it with its constrained-
            # impersonation verbs, "cannot impersonate-on:user-info:create resource ..."; earlier
            # releases 'groups "system:masters" is forbidden: ... cannot impersonate ...').
            assert f'User "{me}" cannot impersonate' in answer["message"], answer
            got = kubectl(["get", "configmap", "by-masters", "-n", namespace], check=False)
            assert got.returncode == 1 and "NotFound" in got.stderr
            ssr = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
            code, answer = post("alice", "devs", "/apis/authentication.k8s.io/v1/selfsubjectreviews", ssr)
            assert code == 201, answer
            assert answer["status"]["userInfo"]["groups"] == ["devs", "system:authenticated"]
        finally:
            rp.stop()
    finally:
        for d in applied:
            if d["kind"] != "ServiceAccount":
                kubectl(["delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found"])
