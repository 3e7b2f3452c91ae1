"""The image (Dockerfile, not buildable here: no Docker engine) agrees with the chart that runs
it: a numeric non-root user equal to the chart's runAsUser, the config path the chart mounts, the
ports it exposes, a multi-stage build whose final stage carries no build tools, and a
.dockerignore that lets in exactly what `pip install .` needs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

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
