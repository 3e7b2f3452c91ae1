"""Upstream credentials from kubeconfigs and the in-cluster service account."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import pytest
import yaml

from kproxy.config import ConfigError
from kproxy.core.status import StatusError
from kproxy.localcluster import certs
from kproxy.server.kubeconfig import ExecToken, FileToken, StaticToken, from_kubeconfig, in_cluster, resolve_upstream


def write_kc(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None, ctx: str = "c") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": ctx,
                "clusters": [{"name": "cl", "cluster": cluster or {"server": "https://127.0.0.1:6443/"}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "cl", "user": "u"}}],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def pki() -> tuple[certs.CertKey, certs.CertKey]:
    ca = certs.generate_ca()
    return ca, certs.generate_client_cert(ca, "me", ["system:masters"])


def test_embedded_data_and_token(tmp_path: Path, pki: tuple[certs.CertKey, certs.CertKey]) -> None:
    ca, client = pki
    b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
    kc = write_kc(
        tmp_path / "kc",
        {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem), "token": "t0k"},
        {
            "server": "https://127.0.0.1:6443/",
            "certificate-authority-data": b64(ca.cert_pem),
            "tls-server-name": "kubernetes",
        },
    )
    t = from_kubeconfig(str(kc))
    assert t.server == "https://127.0.0.1:6443"  # trailing slash dropped
    assert t.ca_pem == ca.cert_pem and t.client_cert_pem == client.cert_pem and t.client_key_pem == client.key_pem
    assert t.tls_server_name == "kubernetes"
    assert isinstance(t.token, StaticToken) and t.token.value == "t0k"
    own, fwd = t.ssl_context(True), t.ssl_context(False)
    assert own is not None and fwd is not None
    assert own.verify_mode == fwd.verify_mode == 2  # CERT_REQUIRED


def test_relative_files_resolve_against_the_kubeconfig(
    tmp_path: Path, pki: tuple[certs.CertKey, certs.CertKey]
) -> None:
    ca, _client = pki
    d = tmp_path / "conf"
    d.mkdir()
    (d / "ca.crt").write_bytes(ca.cert_pem)
    (d / "tok").write_text("file-token\n")
    kc = write_kc(d / "kc", {"tokenFile": "tok"}, {"server": "https://h:1", "certificate-authority": "ca.crt"})
    os.chdir(tmp_path)  # not the kubeconfig's directory
    t = from_kubeconfig(str(kc))
    assert t.ca_pem == ca.cert_pem
    assert isinstance(t.token, FileToken) and t.token.path == str(d / "tok")


async def test_file_token_is_reread_when_it_rotates(tmp_path: Path) -> None:
    tok = tmp_path / "token"
    tok.write_text("one\n")
    src = FileToken(str(tok), recheck=0.0)
    assert await src.token() == "one"
    tok.write_text("two\n")
    os.utime(tok, (1, 1))  # a different mtime, as an atomic symlink swap gives
    assert await src.token() == "two"


async def test_exec_plugin_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "calls = os.path.join(os.path.dirname(sys.argv[0]), 'calls')\n"
        "open(calls, 'a').write('x')\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "  'status': {'token': 'exec-' + os.environ['SUFFIX'], 'expirationTimestamp': '2999-01-01T00:00:00Z'}}))\n"
    )
    kc = write_kc(
        tmp_path / "kc",
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": sys.executable,
                "args": [str(plugin)],
                "env": [{"name": "SUFFIX", "value": "abc"}],
            }
        },
        {"server": "http://127.0.0.1:1"},
    )
    t = from_kubeconfig(str(kc))
    assert isinstance(t.token, ExecToken)
    assert await t.token.token() == "exec-abc"
    assert await t.token.token() == "exec-abc"  # cached until it expires
    assert (tmp_path / "calls").read_text() == "x"


async def test_exec_plugin_failure_is_a_status_naming_the_plugin(tmp_path: Path) -> None:
    kc = write_kc(tmp_path / "kc", {"exec": {"command": "false", "apiVersion": "client.authentication.k8s.io/v1"}})
    t = from_kubeconfig(str(kc))
    assert t.token is not None
    with pytest.raises(
        StatusError, match="kproxy's upstream credentials: exec: executable false failed with exit code 1"
    ):
        await t.token.token()


def test_missing_exec_plugin_is_a_start_up_error_with_the_install_hint(tmp_path: Path) -> None:
    hint = "Install kproxy-no-such-plugin by following\n https://example.com/install"
    user = {
        "exec": {
            "command": "kproxy-no-such-plugin",
            "apiVersion": "client.authentication.k8s.io/v1",
            "installHint": hint,
        }
    }
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(str(write_kc(tmp_path / "kc", user)))
    assert str(err.value) == (
        "exec: executable kproxy-no-such-plugin not found (a client-go credential plugin the kubeconfig names is not "
        "installed): Install kproxy-no-such-plugin by following https://example.com/install"
    )


def test_merge_first_file_wins_and_context_override(tmp_path: Path) -> None:
    a = write_kc(tmp_path / "a", {"token": "from-a"})
    b = tmp_path / "b"
    b.write_text(
        yaml.safe_dump(
            {
                "current-context": "other",
                "clusters": [
                    {"name": "cl", "cluster": {"server": "https://ignored:1"}},
                    {"name": "cl2", "cluster": {"server": "https://two:2"}},
                ],
                "users": [{"name": "u2", "user": {"token": "from-b"}}],
                "contexts": [{"name": "other", "context": {"cluster": "cl2", "user": "u2"}}],
            }
        )
    )
    t = from_kubeconfig(f"{a}{os.pathsep}{b}")
    assert t.server == "https://127.0.0.1:6443"
    t2 = from_kubeconfig(f"{a}{os.pathsep}{b}", context="other")
    assert t2.server == "https://two:2" and isinstance(t2.token, StaticToken) and t2.token.value == "from-b"
    with pytest.raises(ConfigError, match="context 'nope' not found"):
        from_kubeconfig(str(a), context="nope")


def test_insecure_only_when_the_kubeconfig_says_so(tmp_path: Path) -> None:
    t = from_kubeconfig(str(write_kc(tmp_path / "kc", {}, {"server": "https://h:1", "insecure-skip-tls-verify": True})))
    ctx = t.ssl_context()
    assert ctx is not None and ctx.verify_mode == 0 and not ctx.check_hostname


def test_in_cluster_layout(tmp_path: Path, pki: tuple[certs.CertKey, certs.CertKey]) -> None:
    ca, _ = pki
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    t = in_cluster(str(tmp_path), env)
    assert t.server == "https://10.0.0.1:443" and t.ca_pem == ca.cert_pem
    assert isinstance(t.token, FileToken)
    v6 = in_cluster(str(tmp_path), {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster(str(tmp_path), {})


def test_resolve_prefers_explicit_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = write_kc(tmp_path / "x", {"token": "x"}, {"server": "https://explicit:1"})
    env = write_kc(tmp_path / "e", {"token": "e"}, {"server": "https://env:1"})
    monkeypatch.setenv("KUBECONFIG", str(env))
    assert resolve_upstream(str(explicit), None).server == "https://explicit:1"
    assert resolve_upstream(None, None).server == "https://env:1"
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="no upstream"):
        resolve_upstream(None, None)
