"""The release artifacts, built and used as a release would build and use them.

The sdist and the wheel are built by tools/build_dist.py (sdist first, the wheel from the unpacked sdist,
as ``python -m build`` does); the wheel is installed into a fresh virtualenv with the image's locked,
hashed dependencies (requirements.lock, the Dockerfile's own steps) and, from there, proxies the real
kube-apiserver through the transcode filter, which needs the protobuf schema shipped as package data.
The chart is packaged with ``helm package`` and the package itself linted and rendered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from email.parser import HeaderParser
from pathlib import Path

import pytest
import yaml

from kproxy import __version__
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.localcluster.processes import free_ports
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kproxy"
TOP_LEVEL_SDIST = {"LICENSE", "PKG-INFO", "README.md", "pyproject.toml", "setup.cfg"}


def source_files() -> set[str]:
    """What the kproxy package is made of in the checkout: modules and package data."""
    return {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "kproxy").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def assert_no_test_code(names: set[str]) -> None:
    shipped_tests = {
        n for n in names if re.search(r"(^|/)(tests?|examples|benchmarks|tools)/|(^|/)(test_[^/]*|conftest)\.py$", n)
    }
    assert not shipped_tests, f"test or development code in a release artifact: {sorted(shipped_tests)}"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "build_dist.py"), str(out)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    sdist, wheel = (Path(line) for line in proc.stdout.split())
    assert sdist.name == f"kproxy-{__version__}.tar.gz"
    assert wheel.name == f"kproxy-{__version__}-py3-none-any.whl"
    return sdist, wheel


@pytest.fixture(scope="module")
def fresh_venv(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv holding only requirements.lock (hash-checked) and the wheel, as the image does."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(venv / "bin" / "python")]
    for args in (
        ["install", "--require-hashes", "--no-deps", "-r", str(REPO / "requirements.lock")],
        ["install", "--no-deps", str(dists[1])],
        ["check"],  # the lock holds every run-time dependency of the wheel, at a version it accepts
    ):
        proc = subprocess.run([*pip, *args], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return venv


def isolated_env() -> dict[str, str]:
    """The environment without anything that would let the checkout's kproxy be imported."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG")}


def test_sdist_holds_the_package_its_data_and_license_and_no_tests(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    root = f"kproxy-{__version__}/"
    with tarfile.open(sdist) as tar:
        names = {m.name.removeprefix(root) for m in tar.getmembers() if m.isfile()}
        pkg_info = tar.extractfile(root + "PKG-INFO")
        assert pkg_info is not None
        meta = HeaderParser().parsestr(pkg_info.read().decode())
    assert meta["Version"] == __version__
    package = {n for n in names if n.startswith("kproxy/")}
    assert package == source_files()
    others = names - package - {n for n in names if n.startswith("kproxy.egg-info/")}
    assert others == TOP_LEVEL_SDIST
    assert_no_test_code(names)


def test_wheel_holds_the_package_data_license_and_entry_point_and_no_tests(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    info = f"kproxy-{__version__}.dist-info/"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        meta = HeaderParser().parsestr(whl.read(info + "METADATA").decode())
        entry_points = whl.read(info + "entry_points.txt").decode()
        license_text = whl.read(info + "licenses/LICENSE")
    assert {n for n in names if not n.startswith(info)} == source_files()
    assert {"kproxy/codec/data/kubernetes.binpb", "kproxy/codec/data/kubernetes-json.json"} <= names
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert license_text == (REPO / "LICENSE").read_bytes()
    assert re.search(r"^kproxy = kproxy\.cli:entry$", entry_points, re.MULTILINE)
    assert_no_test_code(names)


def test_the_wheel_runs_from_a_fresh_venv_with_the_locked_dependencies(fresh_venv: Path, tmp_path: Path) -> None:
    kproxy = fresh_venv / "bin" / "kproxy"
    env = isolated_env()
    version = subprocess.run([kproxy, "--version"], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    assert version.stdout.strip() == f"kproxy {__version__}"
    # The installed copy, not the checkout's, with its schema loadable from the package data.
    probe = "import kproxy, kproxy.codec.schema as s; s.load_schema(); print(kproxy.__file__)"
    where = subprocess.run(
        [fresh_venv / "bin" / "python", "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path, env=env
    )
    assert Path(where.stdout.strip()).is_relative_to(fresh_venv)
    config = REPO / "config.recommended.yaml"
    check = subprocess.run([kproxy, "check-config", config], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert check.returncode == 0, check.stderr


@pytest.fixture
def installed_proxy(fresh_venv: Path, control_plane: ControlPlaneInfo, tmp_path: Path) -> Iterator[RunningProxy]:
    """`kproxy run` from the fresh venv (not the checkout), with transcode: protobuf to the apiserver."""
    port, admin = free_ports(2)
    cfg = {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "upstream": {"kubeconfig": str(control_plane.admin_kubeconfig)},
        "filters": [{"name": "transcode", "upstream": "protobuf"}],
    }
    cfg_path = tmp_path / "kproxy.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    kproxy = fresh_venv / "bin" / "kproxy"
    kubeconfig = tmp_path / "kproxy.kubeconfig"
    env = isolated_env()
    subprocess.run(
        [kproxy, "kubeconfig", "--config", cfg_path, "--output", kubeconfig], check=True, cwd=tmp_path, env=env
    )
    log = tmp_path / "kproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [kproxy, "run", "--config", cfg_path], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env
        )
    rp = RunningProxy(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", kubeconfig, proc, log, cfg, env)

    def ready() -> bool:
        assert proc.poll() is None, f"kproxy exited with {proc.returncode}:\n{rp.log_text()}"
        return rp.get("/readyz", admin=True, timeout=2)[0] == 200

    try:
        eventually(ready, 30, "the installed kproxy to become ready")
        yield rp
    finally:
        rp.stop()


def test_the_installed_wheel_proxies_the_apiserver_through_its_shipped_schema(
    installed_proxy: RunningProxy, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str
) -> None:
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shipped"}, "data": {"k": "v"}}
    kubectl(["-n", namespace, "apply", "-f", "-"], kubeconfig=installed_proxy.kubeconfig, input=json.dumps(manifest))
    code, body = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/shipped")
    assert code == 200 and json.loads(body)["data"] == {"k": "v"}  # persisted, seen by the admin directly
    through = kubectl.json(["-n", namespace, "get", "configmap", "shipped"], kubeconfig=installed_proxy.kubeconfig)
    assert through["data"] == {"k": "v"}
    # The JSON kubectl read was rebuilt from the apiserver's protobuf by the installed codec.
    transcoded = re.findall(r"^kproxy_transcode_responses_total\{[^}]*\} (\S+)$", installed_proxy.metrics(), re.M)
    assert sum(float(v) for v in transcoded) > 0, installed_proxy.metrics()


def helm_binary() -> Path:
    if override := os.environ.get("KPROXY_HELM_BIN"):
        return Path(override)
    go_mod = (REPO / "tools" / "helm" / "go.mod").read_text()
    pin = re.search(r"^\s*(?:require\s+)?helm\.sh/helm/v4\s+(v\S+)", go_mod, re.MULTILINE)
    assert pin, "no helm.sh/helm/v4 pin in tools/helm/go.mod"
    binary = Path.home() / ".cache" / "kproxy" / "helm" / pin.group(1) / "helm"
    if not binary.exists():
        pytest.fail(f"no helm at {binary}: `make helm-bin` builds it", pytrace=False)
    return binary


@pytest.mark.helm
def test_the_chart_packages_lints_and_renders_as_released(tmp_path: Path) -> None:
    helm = helm_binary()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__  # the image tag the chart deploys by default
    packaged = subprocess.run(
        [helm, "package", CHART, "--destination", tmp_path], capture_output=True, text=True, check=False
    )
    assert packaged.returncode == 0, packaged.stderr
    package = tmp_path / f"kproxy-{chart['version']}.tgz"
    with tarfile.open(package) as tar:
        names = {m.name for m in tar.getmembers() if m.isfile()}
    assert {"kproxy/Chart.yaml", "kproxy/values.yaml", "kproxy/values.schema.json", "kproxy/README.md"} <= names
    assert not {n for n in names if n.startswith(("kproxy/ci/", "kproxy/tests/")) or n.endswith((".orig", ".bak"))}
    lint = subprocess.run([helm, "lint", "--strict", package], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = subprocess.run([helm, "template", "kproxy", package], capture_output=True, text=True, check=False)
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert "Deployment" in kinds


def test_the_changelog_has_a_dated_entry_for_this_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(r"^## \[Unreleased\]$", changelog, re.MULTILINE)  # Keep a Changelog's section for what is next
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE)
    assert re.search(rf"^\[{re.escape(__version__)}\]: \S+$", changelog, re.MULTILINE)
