"""The command line as people use it: help when bare, --version, examples, environment overrides, stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from kproxy import __version__


def kproxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KPROXY_")}
    return subprocess.run(
        [sys.executable, "-m", "kproxy.cli", *args], capture_output=True, text=True, env={**base, **(env or {})}
    )


def test_bare_command_prints_help_and_succeeds() -> None:
    out = kproxy()
    assert out.returncode == 0
    assert out.stdout.startswith("usage: kproxy")
    assert "examples:" in out.stdout and "KPROXY_LISTEN" in out.stdout


def test_version_flag_and_command() -> None:
    assert kproxy("--version").stdout.strip() == f"kproxy {__version__}"
    assert kproxy("version").stdout.strip() == f"kproxy {__version__}"


def test_every_subcommand_help_has_examples() -> None:
    for command in ("run", "check-config", "kubeconfig", "version"):
        out = kproxy(command, "--help")
        assert out.returncode == 0, command
        assert "examples:\n  kproxy " in out.stdout, command
    assert "log threshold" in kproxy("run", "--help").stdout


def test_kubeconfig_goes_to_stdout_by_default() -> None:
    out = kproxy("kubeconfig")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert doc["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:8001"


def test_environment_sets_flags_and_a_flag_wins(tmp_path: Path) -> None:
    out = kproxy("kubeconfig", env={"KPROXY_LISTEN": "127.0.0.1:18080"})
    assert yaml.safe_load(out.stdout)["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:18080"
    out = kproxy("kubeconfig", "--listen", "127.0.0.1:18081", env={"KPROXY_LISTEN": "127.0.0.1:18080"})
    assert yaml.safe_load(out.stdout)["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:18081"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("listen: 127.0.0.1:18082\n")
    out = kproxy("kubeconfig", env={"KPROXY_CONFIG": str(cfg)})
    assert yaml.safe_load(out.stdout)["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:18082"


def test_config_error_is_one_line_naming_the_key_and_the_near_miss(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("credentails: forward\n")
    out = kproxy("check-config", str(cfg))
    assert out.returncode == 2
    assert out.stderr == "kproxy: config error: credentails: unknown key (did you mean 'credentials'?)\n"


def test_check_config_prints_the_values_in_effect(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("filters: [{name: compression}]\n")
    out = kproxy("check-config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "null" not in out.stdout
    assert "gzip_level: " in out.stdout and "zstd_level: " in out.stdout
