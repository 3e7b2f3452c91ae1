"""What ``make run`` prints: commands that show each filter of the recommended chain at work.

The steps are data (:data:`STEPS`) so that the end-to-end test runs exactly the commands printed,
with the same paths, and checks what each says the newcomer will see.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from kproxy.localcluster.cluster import proxy_kubeconfig
from kproxy.localcluster.controlplane import ControlPlaneInfo

__all__ = ["DEMO_NAMESPACES", "STEPS", "Step", "prepare", "render"]

#: Created by the admin straight at the apiserver: through kproxy, creating ``dry-demo`` would itself be a dry run.
DEMO_NAMESPACES = ("dry-demo", "strict-demo")


@dataclass(frozen=True)
class Step:
    """One numbered step: what it shows, shell commands (``$k`` is kubectl, ``$admin`` kproxy's admin URL)."""

    title: str
    commands: tuple[str, ...]
    #: What the newcomer sees, shown after the commands.
    expect: str


STEPS: tuple[Step, ...] = (
    Step(
        "watchcache + compression: a Deployment's pods come up in a watch served from kproxy's cache",
        (
            "$k create deployment web --image=nginx --replicas=2",
            "$k scale deployment web --replicas=6",
            "$k get pods -w -o custom-columns=NAME:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName",
        ),
        "six web-... pods go Pending, then Running on the kwok nodes (Ctrl-C ends the watch); a plain"
        " `get -w` asks for the server's Table form, which kproxy passes to the apiserver",
    ),
    Step(
        "dryrun: every write in a dry-* namespace runs as a dry run",
        (
            "$k -n dry-demo create configmap kept --from-literal=a=b",
            "$k -n dry-demo get configmap kept",
        ),
        'the create answers "created" with a Warning naming the rule; the get answers NotFound',
    ),
    Step(
        "validation: in a strict-* namespace an unknown field is an error, even when the client asks for none",
        (
            """echo '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"typo"},"dataa":{"a":"b"}}' """
            "| $k -n strict-demo create --validate=false -f -",
        ),
        'Error from server (BadRequest): ... strict decoding error: unknown field "dataa"',
    ),
    Step(
        "what it saved: bytes before and after compression, and the watches served from the cache",
        ("curl -s $admin/metrics | grep -E '^kproxy_(compression_(input|output)_bytes_total|watchcache_watches)'",),
        "input bytes several times the output bytes; one line per cached resource with its open watches",
    ),
)


def prepare(info: ControlPlaneInfo) -> None:
    """Create :data:`DEMO_NAMESPACES` (as the admin, at the apiserver); existing ones are kept."""
    for name in DEMO_NAMESPACES:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        code, resp = info.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
        if code not in (201, 409):
            raise RuntimeError(f"creating namespace {name}: HTTP {code}: {resp[:300]!r}")


def admin_url(directory: Path) -> str:
    """kproxy's admin listener (``/metrics``) as its config in the directory gives it."""
    import yaml

    cfg = yaml.safe_load((directory / "kproxy.yaml").read_text())
    return f"http://{cfg['admin_listen']}"


def render(info: ControlPlaneInfo, *, config: str, nodes: int) -> str:
    """The text ``make run`` prints, with this cluster's paths."""
    kubeconfig = proxy_kubeconfig(info.dir)
    lines = [
        f"kproxy runs the recommended chain ({config}) on a living local cluster: etcd, kube-apiserver,",
        f"kube-controller-manager, kube-scheduler and {nodes} KWOK nodes. The controllers reach the apiserver",
        "through kproxy, as they would through a sidecar or gateway.",
        "",
        "Try it in another terminal (copy and paste):",
        f"  export KUBECONFIG={shlex.quote(str(kubeconfig))}",
        f"  k={shlex.quote(str(info.kubectl))}; admin={admin_url(info.dir)}",
    ]
    for n, step in enumerate(STEPS, 1):
        lines += ["", f"{n}. {step.title}"]
        lines += [f"     {c}" for c in step.commands]
        lines += [f"   -> {step.expect}"]
    lines += [
        "",
        f"kproxy's log: {info.dir / 'kproxy.log'}  (the controllers': {info.dir}/kube-*.log)",
    ]
    return "\n".join(lines)
