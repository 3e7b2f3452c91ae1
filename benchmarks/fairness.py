"""A victim's write latency while another caller floods kproxy with costly bodies.

    python -m benchmarks.fairness [--duration 10] [--attackers 0,8,16] [--envtest-dir DIR] [--output FILE]

Two service accounts of one namespace: the attacker loops on N connections sending 3 MB YAML
ConfigMaps with an unknown field (``?fieldValidation=Strict``), the victim creates 20 KiB JSON
ConfigMaps one after another (:mod:`benchmarks.lib.fairness_load`, each side its own process). Peers:

* ``direct``: the kube-apiserver itself (HTTPS, the service accounts' tokens), which decodes and
  refuses the attack bodies itself, under its priority and fairness;
* ``kproxy``: ``kproxy run`` with ``credentials: forward``, TLS, and a validation rule making the
  namespace Strict: kproxy decodes every body and answers the attack's 400s itself.

For 0, 8 and 16 attacking connections (one identity) and each peer, the victim's create latency
p50/p99/max over ``--duration`` seconds of attack, and what the attacker got. The control plane
is started here unless ``--envtest-dir`` names a running one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import log
from benchmarks.lib.stats import percentile
from kproxy.localcluster import envtest
from kproxy.testing.proxyproc import RunningProxy, start_proxy

REPO_ROOT = Path(__file__).resolve().parents[1]
STRICT = [{"name": "validation", "rules": [{"name": "strict", "level": "Strict", "match": {"namespaces": ["fair-*"]}}]}]


@dataclass
class Row:
    peer: str
    attackers: int
    identities: int
    samples: int
    p50: float
    p99: float
    worst: float
    victim_statuses: dict[str, int]
    victim_failures: list[str]
    attack_statuses: dict[str, int]
    attack_errors: int


def writer(info: envtest.ControlPlaneInfo, namespace: str, name: str) -> str:
    """A token of ServiceAccount ``name``, allowed to create, get and list ConfigMaps."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list"]}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    for path, obj in (
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}),
        (f"{rbac}/roles", {"metadata": {"name": name}, "rules": [rule]}),
        (
            f"{rbac}/rolebindings",
            {
                "metadata": {"name": name},
                "roleRef": ref,
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            },
        ),
    ):
        status, body = info.request("POST", path, body=json.dumps(obj).encode())
        if status != 201:
            raise RuntimeError(f"POST {path}: {status} {body[:200]!r}")
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    status, body = info.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body=json.dumps(request).encode()
    )
    if status != 201:
        raise RuntimeError(f"TokenRequest for {name}: {status}")
    token: str = json.loads(body)["status"]["token"]
    return token


def side(role: str, url: str, ca: str, token: str, namespace: str, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "benchmarks.lib.fairness_load", role, "--url", url, "--ca", ca]
    argv += ["--namespace", namespace, *args]
    env = {**os.environ, "FAIRNESS_TOKEN": token}
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"load process failed ({proc.returncode}): {out[-500:]}")
    parsed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return parsed


def measure(
    peer: str,
    url: str,
    ca: str,
    tokens: tuple[list[str], str],
    namespace: str,
    attackers: int,
    duration: float,
    work: Path,
) -> Row:
    """The victim's creates while ``attackers`` connections attack, spread over the attacker
    tokens (one process each)."""
    attacker_tokens, victim = tokens
    ready = work / f"ready-{peer}-{attackers}-{len(attacker_tokens)}"
    attacks = []
    victim_args = ["--duration", str(duration), "--prefix", f"v{attackers}"]
    if attackers:
        for i, token in enumerate(attacker_tokens):
            share = attackers // len(attacker_tokens) + (i < attackers % len(attacker_tokens))
            argv = ["--connections", str(share), "--duration", str(duration + 4), "--ready", str(ready)]
            attacks.append(side("attacker", url, ca, token, namespace, *argv))
        victim_args += ["--ready", str(ready)]
    try:
        measured = result(side("victim", url, ca, victim, namespace, *victim_args), duration + 300)
    finally:
        attacked: dict[str, Any] = {"statuses": Counter(), "errors": 0}
        for attack in attacks:
            one = result(attack, duration + 300)
            attacked["statuses"].update(one["statuses"])
            attacked["errors"] += one["errors"]
    lat = measured["latencies"]
    return Row(
        peer,
        attackers,
        len(attacker_tokens) if attackers else 0,
        len(lat),
        percentile(lat, 50),
        percentile(lat, 99),
        max(lat) if lat else float("nan"),
        measured["statuses"],
        [f"{kind} after {seconds:.1f} s" for kind, seconds in measured["failed"]],
        attacked["statuses"],
        attacked["errors"],
    )


def table(rows: list[Row]) -> str:
    out = [
        "| peer | attacking connections | attacking identities | victim creates | p50 s | p99 s | max s "
        "| victim statuses | attack answers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        attack = ", ".join(f"{k}: {v}" for k, v in sorted(r.attack_statuses.items()))
        if r.attack_errors:
            attack += f"{', ' if attack else ''}connection errors: {r.attack_errors}"
        victims = ", ".join([*(f"{k}: {v}" for k, v in sorted(r.victim_statuses.items())), *r.victim_failures])
        out.append(
            f"| {r.peer} | {r.attackers} | {r.identities} | {r.samples} | {r.p50:.3f} | {r.p99:.3f} | "
            f"{r.worst:.3f} | {victims} | {attack or '-'} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fairness")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of attack per measurement")
    p.add_argument("--attackers", default="0,8,16", help="attacking connections, comma-separated")
    p.add_argument("--peers", default="direct,kproxy")
    p.add_argument(
        "--identities", default="1,2", help="attacking service accounts sharing the connections, comma-separated"
    )
    p.add_argument("--envtest-dir", type=Path, default=None)
    p.add_argument("--output", type=Path, default=None, help="also write the table (markdown) here")
    args = p.parse_args(argv)
    counts = [int(n) for n in args.attackers.split(",")]
    args.identities = [int(n) for n in args.identities.split(",")]
    peers = args.peers.split(",")
    rows: list[Row] = []
    load_before = os.getloadavg()[0]
    with control_plane(args.envtest_dir) as info, tempfile.TemporaryDirectory(prefix="kproxy-fair-") as tmp:
        work = Path(tmp)
        namespace = f"fair-bench-{secrets.token_hex(3)}"
        status, _ = info.request(
            "POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": namespace}}).encode()
        )
        if status != 201:
            raise RuntimeError(f"cannot create namespace {namespace}: {status}")
        rp: RunningProxy | None = None
        try:
            victim = writer(info, namespace, "victim")
            attackers = [writer(info, namespace, f"attacker-{i}") for i in range(max(args.identities))]
            rp = start_proxy(
                work / "kproxy",
                info.admin_kubeconfig,
                credentials="forward",
                tls=True,
                extra={"filters": STRICT, "log": {"level": "warning", "access_log": False}},
            )
            urls = {"direct": (info.server, str(info.ca_file)), "kproxy": (rp.url, str(rp.ca_file))}
            for peer in peers:  # warm: schemas loaded, tokens reviewed
                url, ca = urls[peer]
                measure(peer, url, ca, ([], victim), namespace, 0, 1.0, work)
            for n in counts:
                for k in args.identities if n else [1]:
                    for peer in peers:
                        url, ca = urls[peer]
                        log(f"{peer}: victim under {n} attacking connections of {k} identities ...")
                        rows.append(measure(peer, url, ca, (attackers[:k], victim), namespace, n, args.duration, work))
                    log(f"  p50 {rows[-1].p50:.3f}s p99 {rows[-1].p99:.3f}s ({rows[-1].samples} creates)")
        finally:
            if rp is not None:
                rp.stop()
            info.request("DELETE", f"/api/v1/namespaces/{namespace}")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"fairness benchmark, {now}: python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}; {args.duration:g} s of attack "
        "per row; victim: 20 KiB JSON ConfigMap creates, one at a time; attacker: 3 MB YAML ConfigMaps with an "
        "unknown field, N connections shared by the attacking identities; Strict in the namespace (kproxy: a "
        "validation rule; direct: ?fieldValidation=Strict)."
    )
    text = header + "\n\n" + table(rows) + "\n"
    print(text)
    if args.output is not None:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
