"""The image (Dockerfile, not buildable here: no Docker engine) agrees with the chart that runs
it: a numeric non-root user equal to the chart's runAsUser, the config path the chart mounts, the
ports it exposes, a multi-stage build whose final stage carries no build tools, and a
.dockerignore that lets in exactly what the build copies. It agrees with the suite too: the same
Python minor, and requirements.lock (installed with its hashes) pinning the versions tested here.
tests/e2e/test_release_artifacts.py installs that lock and the wheel into a fresh venv, as the image does."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
VALUES = yaml.safe_load((REPO / "deploy" / "helm" / "kproxy" / "values.yaml").read_text())
HELPERS = (REPO / "deploy" / "helm" / "kproxy" / "templates" / "_helpers.tpl").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, re.MULTILINE)


def test_multi_stage_and_the_last_stage_only_copies_the_venv() -> None:
    stages = instructions("FROM")
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    final = DOCKERFILE.split("\nFROM ")[-1]
    assert "RUN " not in final  # nothing installed or compiled in the runtime image
    assert "COPY --from=build /opt/kproxy /opt/kproxy" in final


def test_runs_as_the_chart_numeric_non_root_user() -> None:
    (user,) = instructions("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0
    assert int(uid) == VALUES["podSecurityContext"]["runAsUser"]
    assert int(gid) == VALUES["podSecurityContext"]["runAsGroup"]


def test_command_and_ports_match_the_chart() -> None:
    (entrypoint,) = instructions("ENTRYPOINT")
    (cmd,) = instructions("CMD")
    assert json.loads(entrypoint) == ["kproxy"]
    chart_args = json.loads(re.search(r"args: (\[.*\])", HELPERS).group(1))  # type: ignore[union-attr]
    assert json.loads(cmd) == chart_args
    (expose,) = instructions("EXPOSE")
    assert sorted(int(p) for p in expose.split()) == sorted(VALUES["ports"].values())


def test_dockerignore_admits_what_the_build_copies() -> None:
    allowed = [
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    copied = [src for args in instructions("COPY") if "--from" not in args for src in args.split()[:-1]]
    assert sorted(allowed) == sorted(c.rstrip("/").removeprefix("./") for c in copied)


# --------------------------------------------------------------------------- the lock the image installs

LOCK = REPO / "requirements.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def locked() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock as {name: (version, hashes)} (pip's format: continuation lines, comments)."""
    joined = re.sub(r"\\\n", " ", LOCK.read_text())
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert m, f"requirements.lock: not an exact pin with hashes: {line[:120]}"
        entries[canonicalize_name(m.group(1))] = (m.group(2), m.group(3).split())
    return entries


def runtime_closure(requirements: list[str]) -> set[str]:
    """Every distribution pyproject's run-time dependencies pull in, as installed here (markers and extras
    evaluated for this interpreter: the one the suite runs on)."""
    seen: set[tuple[str, frozenset[str]]] = set()

    def visit(req: Requirement, parent_extras: frozenset[str]) -> None:
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in {"", *parent_extras}):
            return
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            return
        seen.add(key)
        for child in metadata.requires(req.name) or []:
            visit(Requirement(child), key[1])

    for r in requirements:
        visit(Requirement(r), frozenset())
    return {name for name, _ in seen}


def test_the_image_runs_the_python_minor_the_suite_runs_on() -> None:
    (arg,) = [a for a in instructions("ARG") if a.startswith("PYTHON_VERSION=")]
    assert arg.removeprefix("PYTHON_VERSION=") == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_build_installs_the_hashed_lock_and_resolves_nothing_else() -> None:
    build = DOCKERFILE.split("\nFROM ")[1]
    installs = re.findall(r"pip install ([^\\&\n]+)", build)
    assert [i.strip() for i in installs] == [
        "--require-hashes --no-deps -r requirements.lock",  # every dependency, hash-checked
        "--no-deps --no-build-isolation .",  # kproxy, built by the locked backend, nothing downloaded
    ]
    assert "pip check" in build  # the lock is complete for what kproxy requires
    assert "pip uninstall -y setuptools pip" in build  # the build backend does not reach the runtime image


def test_the_lock_pins_every_runtime_dependency_at_the_tested_version_with_hashes() -> None:
    """The image gets exactly the versions this suite runs against (`make lock` after an upgrade)."""
    entries = locked()
    backend = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    expected = runtime_closure(PYPROJECT["project"]["dependencies"]) | {canonicalize_name(r.name) for r in backend}
    assert set(entries) == expected
    stale = {n: (v, metadata.version(n)) for n, (v, _) in entries.items() if v != metadata.version(n)}
    assert not stale, f"requirements.lock differs from the tested versions (locked, tested): {stale}; run `make lock`"
    assert all(hashes for _, hashes in entries.values())
    for r in backend:
        assert entries[canonicalize_name(r.name)][0] in r.specifier
