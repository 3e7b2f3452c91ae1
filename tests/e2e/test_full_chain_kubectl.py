"""kproxy with EVERY built-in filter in one chain, driven by the real kubectl.

Users run kproxy with all its filters at once, so this file does too: ``compression`` (watches
included) outermost, then ``transcode`` (protobuf upstream), ``dryrun`` (dry runs forced in
``dry-*`` namespaces), ``validation`` (Strict in ``strict-*`` namespaces, Warn elsewhere) and
``watchcache`` (pods, configmaps, deployments). Each kubectl command runs through kproxy and
straight on the apiserver, and the two outputs are compared (ages, uids, resource versions,
timestamps and namespace names masked). Every test runs against three kproxies: `credentials:
forward` over TLS (kubectl's bearer token reaches the apiserver; the cache authorizes each read)
and `credentials: proxy` over plain HTTP (where kubectl always asks for gzip) with the filters in
the order above (config.example.yaml's sections), and `forward` over TLS in the order that works
(compression, watchcache, dryrun, validation, transcode; docs/using/configuration.md#the-order-that-works)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_watchcache_outage import metric
from test_watchcache_watch_kubectl import KubectlWatch, objects, table

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

DRY_RULE = "dry-namespaces"
#: The order config.example.yaml's sections give (compression first, as it says), and the order
#: docs/using/configuration.md#the-order-that-works calls the one that works; both are run.
ORDER = ("compression", "transcode", "dryrun", "validation", "watchcache")
README_ORDER = ("compression", "watchcache", "dryrun", "validation", "transcode")
DRY_WARNING = f'Warning: kproxy dryrun rule "{DRY_RULE}" ran this request as a dry run: nothing was persisted'


def full_chain(order: tuple[str, ...] = ORDER) -> list[dict[str, Any]]:
    """Every built-in filter, in ``order`` (outermost first)."""
    settings: dict[str, dict[str, Any]] = {
        "compression": {"watch": True},
        "transcode": {"upstream": "protobuf"},
        "dryrun": {"rules": [{"name": DRY_RULE, "match": {"namespaces": ["dry-*"]}, "action": "enforce"}]},
        "validation": {
            "rules": [
                {"name": "strict-namespaces", "match": {"namespaces": ["strict-*"]}, "level": "Strict"},
                {"name": "everywhere-else", "level": "Warn"},
            ]
        },
        "watchcache": {"resources": ["pods", "configmaps", "deployments.apps"]},
    }
    return [{"name": name, **settings[name]} for name in order]


@dataclass
class Chain:
    """A running full-chain kproxy and the kubeconfigs that reach it."""

    mode: str
    rp: RunningProxy
    admin: Path  # kubectl through kproxy as a cluster admin
    user: Path | None  # kubectl through kproxy as the user without RBAC (forward mode only)


def _user_kubeconfig(rp: RunningProxy, token: str) -> Path:
    assert rp.config_path is not None and rp.ca_file is not None
    out = rp.config_path.parent / "user.kubeconfig"
    cmd = [sys.executable, "-m", "kproxy.cli", "kubeconfig", "--config", str(rp.config_path), "--output", str(out)]
    subprocess.run([*cmd, f"--token={token}", "--certificate-authority", str(rp.ca_file)], check=True)
    return out


@pytest.fixture(scope="module", params=["forward-tls", "proxy-http", "forward-tls-readme-order"])
def chain(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chain]:
    cp = control_plane
    tmp = tmp_path_factory.mktemp(f"full-chain-{request.param}")
    extra = {"filters": full_chain(README_ORDER if request.param.endswith("readme-order") else ORDER)}
    if request.param.startswith("forward-tls"):
        rp = start_proxy(tmp, cp.admin_kubeconfig, credentials="forward", tls=True, token=cp.admin_token, extra=extra)
        ch = Chain(request.param, rp, rp.kubeconfig, _user_kubeconfig(rp, cp.user_token))
    else:
        rp = start_proxy(tmp, cp.admin_kubeconfig, extra=extra)
        ch = Chain(request.param, rp, rp.kubeconfig, None)
    yield ch
    rp.stop()


@pytest.fixture
def make_namespace(control_plane: ControlPlaneInfo) -> Iterator[Callable[[str], str]]:
    """Namespaces with a chosen prefix (the policy rules match ``dry-*`` and ``strict-*``)."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{secrets.token_hex(3)}"
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        status, data = control_plane.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())
        assert status == 201, data
        made.append(name)
        return name

    yield make
    for name in made:
        control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


# --------------------------------------------------------------------------- masking

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_RV = re.compile(r'(resourceVersion"?:\s*)"\d+"')
_DIFF_HEAD = re.compile(r"^(diff -u -N|---|\+\+\+) .*$", re.M)


def mask(text: str, *namespaces: str) -> str:
    """Text without what differs between two runs of the same command in two namespaces."""
    for ns in namespaces:
        text = text.replace(ns, "<ns>")
    text = _DIFF_HEAD.sub(r"\1 <files>", text)
    return _RV.sub(r'\1"<rv>"', _UID.sub("<uid>", _TIME.sub("<time>", text)))


def cells(text: str) -> list[list[str]]:
    """Every table kubectl printed (blank lines between kinds), cells split, AGE columns dropped
    (an age that grows a character, 9s to 10s, widens its column, so cells, not lines)."""
    out: list[list[str]] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        out += table(block) if "AGE" in block.split("\n", 1)[0].split() else [ln.split() for ln in block.splitlines()]
    return out


@dataclass
class Run:
    rc: int
    out: str
    err: str


class Sides:
    """One kubectl command through kproxy and straight on the apiserver."""

    def __init__(self, kubectl: Kubectl, chain: Chain) -> None:
        self.kubectl = kubectl
        self.chain = chain

    def via(self, args: list[str], stdin: str | None = None, kubeconfig: Path | None = None) -> Run:
        p = self.kubectl(args, kubeconfig=kubeconfig or self.chain.admin, check=False, input=stdin)
        return Run(p.returncode, p.stdout, p.stderr)

    def direct(self, args: list[str], stdin: str | None = None, kubeconfig: Path | None = None) -> Run:
        p = self.kubectl(args, kubeconfig=kubeconfig, check=False, input=stdin)
        return Run(p.returncode, p.stdout, p.stderr)

    def same_in(self, args: list[str], ns_via: str, ns_direct: str, stdin: str | None = None) -> Run:
        """``args`` in ``ns_via`` through kproxy and in ``ns_direct`` directly: equal once masked."""
        via = self.via([*args, "-n", ns_via], stdin)
        direct = self.direct([*args, "-n", ns_direct], stdin)
        assert via.rc == direct.rc, (args, via, direct)
        assert mask(via.out, ns_via) == mask(direct.out, ns_direct), (args, via.out, direct.out)
        assert mask(via.err, ns_via) == mask(direct.err, ns_direct), (args, via.err, direct.err)
        return via

    def same(self, args: list[str]) -> Run:
        """A read through kproxy and directly: identical output."""
        via, direct = self.via(args), self.direct(args)
        assert (via.rc, via.out, via.err) == (direct.rc, direct.out, direct.err), (args, via, direct)
        return via

    def obj(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        """The object as the apiserver has it (read directly), masked; None when absent."""
        p = self.kubectl(
            ["get", kind, name, "-n", ns, "-o", "json", "--ignore-not-found", "--show-managed-fields"], check=True
        )
        if not p.stdout.strip():
            return None
        obj: dict[str, Any] = json.loads(mask(p.stdout, ns))
        # The apiserver orders managedFields by time, then manager: writes a second apart on the
        # two sides order them differently.
        obj["metadata"].get("managedFields", []).sort(key=lambda m: (m["manager"], m["operation"]))
        return obj


@pytest.fixture
def sides(kubectl: Kubectl, chain: Chain) -> Sides:
    return Sides(kubectl, chain)


@pytest.fixture
def pair(make_namespace: Callable[[str], str]) -> tuple[str, str]:
    """Two namespaces with the same contents: one written through kproxy, one directly."""
    return make_namespace("kw-via"), make_namespace("kw-direct")


def configmap(name: str, **data: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})


def deployment(name: str, image: str = "nginx:1.27", replicas: int = 2, **extra: Any) -> str:
    labels = {"app": name}
    spec = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": image}]}},
    }
    return yaml.safe_dump(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels}, "spec": spec}
        | extra
    )


def manifests(*docs: str) -> str:
    return "---\n".join(docs)


# --------------------------------------------------------------------------- writes


def test_client_side_apply_and_diff(sides: Sides, pair: tuple[str, str]) -> None:
    via_ns, direct_ns = pair
    first = manifests(configmap("settings", mode="a"), deployment("web"))
    run = sides.same_in(["apply", "-f", "-"], via_ns, direct_ns, first)
    assert run.out == "configmap/settings created\ndeployment.apps/web created\n", run
    for kind, name in (("configmap", "settings"), ("deployment", "web")):
        via = sides.obj(kind, name, via_ns)
        assert via is not None and via == sides.obj(kind, name, direct_ns)
    assert sides.obj("configmap", "settings", via_ns)["data"] == {"mode": "a"}  # type: ignore[index]

    # diff: exit 0 and nothing printed when the live objects match, 1 and the diff when not.
    run = sides.same_in(["diff", "-f", "-"], via_ns, direct_ns, first)
    assert (run.rc, run.out) == (0, "")
    changed = manifests(configmap("settings", mode="b"), deployment("web", image="nginx:1.28"))
    run = sides.same_in(["diff", "-f", "-"], via_ns, direct_ns, changed)
    assert run.rc == 1
    assert "-  mode: a\n+  mode: b\n" in run.out and "-      - image: nginx:1.27\n+      - image: nginx:1.28" in run.out

    run = sides.same_in(["apply", "-f", "-"], via_ns, direct_ns, changed)
    assert run.out == "configmap/settings configured\ndeployment.apps/web configured\n"
    assert sides.obj("deployment", "web", via_ns) == sides.obj("deployment", "web", direct_ns)
    assert sides.same_in(["diff", "-f", "-"], via_ns, direct_ns, changed).rc == 0


def test_server_side_apply_with_a_conflicting_manager(sides: Sides, pair: tuple[str, str]) -> None:
    via_ns, direct_ns = pair
    docs = manifests(configmap("settings", mode="a"), deployment("web"))
    run = sides.same_in(["apply", "--server-side", "-f", "-"], via_ns, direct_ns, docs)
    assert run.out == "configmap/settings serverside-applied\ndeployment.apps/web serverside-applied\n"

    other = ["apply", "--server-side", "--field-manager=other-team", "-f", "-"]
    theirs = manifests(configmap("settings", mode="b"), deployment("web", replicas=5))
    run = sides.same_in(other, via_ns, direct_ns, theirs)
    assert run.rc == 1 and 'Apply failed with 1 conflict: conflict with "kubectl": .data.mode' in run.err, run
    assert 'conflict with "kubectl": .spec.replicas' in run.err
    assert sides.obj("configmap", "settings", via_ns)["data"] == {"mode": "a"}  # type: ignore[index]

    run = sides.same_in([*other, "--force-conflicts"], via_ns, direct_ns, theirs)
    assert run.out == "configmap/settings serverside-applied\ndeployment.apps/web serverside-applied\n"
    for kind, name in (("configmap", "settings"), ("deployment", "web")):
        via = sides.obj(kind, name, via_ns)
        assert via is not None and via == sides.obj(kind, name, direct_ns)
        managers = {(m["manager"], m["operation"]) for m in via["metadata"]["managedFields"]}
        assert ("other-team", "Apply") in managers, managers
    assert sides.obj("deployment", "web", via_ns)["spec"]["replicas"] == 5  # type: ignore[index]


def test_label_annotate_scale_patch_delete(sides: Sides, pair: tuple[str, str]) -> None:
    via_ns, direct_ns = pair
    sides.same_in(["apply", "-f", "-"], via_ns, direct_ns, manifests(configmap("settings", a="1"), deployment("web")))
    steps: list[tuple[list[str], str]] = [
        (["label", "configmap", "settings", "tier=backend"], "configmap/settings labeled\n"),
        (["annotate", "configmap", "settings", "owner=team-a"], "configmap/settings annotated\n"),
        (["scale", "deployment", "web", "--replicas=4"], "deployment.apps/web scaled\n"),
        (
            ["patch", "deployment", "web", "--type=strategic", "-p",
             '{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.29"}]}}}}'],
            "deployment.apps/web patched\n",
        ),
        (["patch", "configmap", "settings", "--type=merge", "-p", '{"data":{"b":"2"}}'],
         "configmap/settings patched\n"),
        (
            ["patch", "configmap", "settings", "--type=json", "-p", '[{"op":"replace","path":"/data/a","value":"9"}]'],
            "configmap/settings patched\n",
        ),
        (["patch", "configmap", "settings", "--type=merge", "-p", '{"data":{"b":"2"}}'],
         "configmap/settings patched (no change)\n"),
    ]  # fmt: skip
    for args, printed in steps:
        assert sides.same_in(args, via_ns, direct_ns).out == printed, args
    cm = sides.obj("configmap", "settings", via_ns)
    assert cm is not None and cm == sides.obj("configmap", "settings", direct_ns)
    assert cm["data"] == {"a": "9", "b": "2"}
    assert cm["metadata"]["labels"] == {"tier": "backend"}
    assert cm["metadata"]["annotations"]["owner"] == "team-a"
    dep = sides.obj("deployment", "web", via_ns)
    assert dep is not None and dep == sides.obj("deployment", "web", direct_ns)
    assert dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.29"

    # delete --wait watches the object (through the cache) until it is gone.
    run = sides.same_in(["delete", "configmap", "settings", "--wait=true", "--timeout=30s"], via_ns, direct_ns)
    assert run.out == 'configmap "settings" deleted from <ns> namespace\n'.replace("<ns>", via_ns), run
    run = sides.same_in(["delete", "deployment", "web", "--wait=true", "--timeout=30s"], via_ns, direct_ns)
    assert sides.obj("configmap", "settings", via_ns) is None
    assert sides.obj("deployment", "web", via_ns) is None


# --------------------------------------------------------------------------- reads


def test_get_outputs_are_the_apiservers(sides: Sides, kubectl: Kubectl, namespace: str) -> None:
    kubectl(["apply", "-n", namespace, "-f", "-"], input=manifests(configmap("one", k="v"), deployment("web")))
    kubectl(["create", "configmap", "two", "-n", namespace, "--from-literal=x=y"])
    for fmt in ("json", "yaml"):
        for what in (["configmaps"], ["configmap", "one"], ["deployments"], ["deployment", "web"]):
            run = sides.same(["get", *what, "-n", namespace, "-o", fmt])
            assert "nginx:1.27" in run.out or "one" in run.out
    for what in (["configmaps"], ["deployments"], ["configmaps,deployments"], ["all"]):
        for extra in ([], ["-o", "wide"], ["--show-labels"], ["-o", "name"]):
            args = ["get", *what, "-n", namespace, *extra]
            via, direct = sides.via(args), sides.direct(args)
            assert via.rc == direct.rc == 0 and via.err == direct.err, (args, via, direct)
            assert cells(via.out) == cells(direct.out), (args, via.out, direct.out)
    wide = cells(sides.via(["get", "deployments", "-n", namespace, "-o", "wide"]).out)
    assert wide[0] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1] == ["web", "0/2", "0", "0", "web", "nginx:1.27", "app=web"]
    # No controller-manager here, so no kube-root-ca.crt: exactly the two configmaps created above.
    assert [r[0] for r in cells(sides.via(["get", "configmaps", "-n", namespace]).out)] == ["NAME", "one", "two"]
    # A missing object: the apiserver's NotFound, word for word.
    run = sides.same(["get", "configmap", "absent", "-n", namespace])
    assert run.rc == 1 and 'configmaps "absent" not found' in run.err


def test_explain_api_resources_and_auth_can_i(sides: Sides, chain: Chain, control_plane: ControlPlaneInfo) -> None:
    run = sides.same(["explain", "deployment.spec"])
    assert (
        "GROUP:      apps" in run.out and "FIELD: spec <DeploymentSpec>" in run.out and "replicas\t<integer>" in run.out
    )
    run = sides.same(["explain", "deployment.spec.template.spec.containers.image"])
    assert "FIELD: image <string>" in run.out
    run = sides.same(["api-resources"])
    assert re.search(r"^deployments +deploy +apps/v1 +true +Deployment$", run.out, re.M), run.out
    assert sides.same(["api-resources", "--api-group=apps", "-o", "wide"]).out.count("\n") >= 5
    run = sides.same(["auth", "can-i", "create", "deployments", "-n", "default"])
    assert (run.rc, run.out) == (0, "yes\n")
    run = sides.same(["auth", "can-i", "--list", "-n", "default"])
    assert "*.*" in run.out
    if chain.user is not None:
        # forward: the caller's own rights, not kproxy's (the user has no RBAC bindings).
        run = sides.via(["auth", "can-i", "create", "deployments", "-n", "default"], kubeconfig=chain.user)
        direct = sides.direct(["auth", "can-i", "create", "deployments", "-n", "default"],
                              kubeconfig=control_plane.user_kubeconfig)  # fmt: skip
        assert (run.rc, run.out) == (direct.rc, direct.out) == (1, "no\n"), (run, direct)
        run = sides.via(["get", "configmaps", "-n", "default"], kubeconfig=chain.user)
        direct = sides.direct(["get", "configmaps", "-n", "default"], kubeconfig=control_plane.user_kubeconfig)
        assert run.rc == direct.rc == 1 and run.err == direct.err and "Forbidden" in run.err, (run, direct)
        run = sides.via(["get", "configmaps", "-n", "default", "-o", "json"], kubeconfig=chain.user)
        assert run.rc == 1 and 'cannot list resource "configmaps"' in run.err, run


def test_raw_limit_and_chunked_lists_page_through_the_cache(
    sides: Sides, chain: Chain, kubectl: Kubectl, namespace: str
) -> None:
    # 30 KB each: every page is compressed (kubectl asks gzip), a whole list is 150 KB. Not digits
    # only: the apiserver's YAML leaves a 30,000-digit string unquoted, and a YAML reader of a
    # cluster-wide list (other tests) would take it for an integer.
    for i in range(5):
        blob = f"x{i}" * 15_000
        kubectl(["create", "configmap", f"cm{i}", "-n", namespace, f"--from-literal=i={i}", f"--from-literal=b={blob}"])
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def reads(**labels: str) -> float:
        return metric(chain.rp, "kproxy_watchcache_reads_total", resource="configmaps", served="cache", **labels)

    def gzipped() -> float:
        return metric(chain.rp, "kproxy_compression_responses_total", encoding="gzip")

    served_before, continued_before, gzipped_before = reads(), reads(reason="continue"), gzipped()

    def names(page: dict[str, Any]) -> list[str]:
        return [item["metadata"]["name"] for item in page["items"]]

    # A consistent read: its resourceVersion is the store's at that moment, which lease renewals
    # move between two reads; kproxy's must lie between the apiserver's just before and after.
    before = json.loads(sides.direct(["get", "--raw", f"{path}?limit=1"]).out)
    via = json.loads(sides.via(["get", "--raw", f"{path}?limit=1"]).out)
    direct = json.loads(sides.direct(["get", "--raw", f"{path}?limit=1"]).out)
    assert via["items"] == direct["items"] and len(via["items"]) == 1
    assert via["metadata"]["remainingItemCount"] == direct["metadata"]["remainingItemCount"]
    rvs = [int(page["metadata"]["resourceVersion"]) for page in (before, via, direct)]
    assert rvs[0] <= rvs[1] <= rvs[2], rvs
    seen = names(via)
    while cont := via["metadata"].get("continue"):
        via = json.loads(sides.via(["get", "--raw", f"{path}?limit=2&continue={cont}"]).out)
        seen += names(via)
    every = [item["metadata"]["name"] for item in json.loads(sides.direct(["get", "--raw", path]).out)["items"]]
    assert seen == every and {f"cm{i}" for i in range(5)} <= set(seen), seen

    # kubectl's own chunking (limit=2, then continue) with a JSON output: pages from the cache.
    args = ["get", "configmaps", "-n", namespace, "--chunk-size=2", "-o", "json"]
    assert json.loads(sides.via(args).out)["items"] == json.loads(sides.direct(args).out)["items"]
    args = ["get", "configmaps", "-n", namespace, "--chunk-size=2"]
    assert cells(sides.via(args).out) == cells(sides.direct(args).out)
    # limit=1 and two pages of two by hand, then kubectl's three pages of two: from the cache,
    # four of them following its continue tokens, each gzipped.
    assert reads() - served_before >= 6
    assert reads(reason="continue") - continued_before >= 4
    assert gzipped() - gzipped_before >= 6


def test_get_watch_sees_each_write_promptly_from_the_cache_compressed(
    chain: Chain, control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    cp = control_plane
    kubectl(["create", "configmap", "first", "-n", namespace, "--from-literal=a=1"])
    args = ["get", "configmaps", "-n", namespace, "--watch", "-o", "json", "--output-watch-events"]

    def cache_watch_count() -> float:
        return metric(chain.rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="watch", served="cache")

    cache_watches = cache_watch_count()
    via = KubectlWatch(cp, chain.admin, args, tmp_path / "via-cache")
    direct = KubectlWatch(cp, cp.admin_kubeconfig, args, tmp_path / "direct-cache")
    # kubectl's default table watch asks for as=Table: the apiserver prints it (through the chain).
    table_args = ["get", "configmaps", "-n", namespace, "--watch"]
    via_table = KubectlWatch(cp, chain.admin, table_args, tmp_path / "via-table")
    direct_table = KubectlWatch(cp, cp.admin_kubeconfig, table_args, tmp_path / "direct-table")
    try:

        def printed(kw: KubectlWatch) -> list[tuple[str, str]]:
            return [(e["type"], e["object"]["metadata"]["name"]) for e in objects(kw.text())]

        for kw in (via, direct):
            eventually(lambda kw=kw: ("ADDED", "first") in printed(kw), 30, "the initial configmaps")  # type: ignore[misc]
        for kw in (via_table, direct_table):
            eventually(lambda kw=kw: len(table(kw.text())) == 2, 30, "the initial table")  # type: ignore[misc]
        eventually(lambda: cache_watch_count() >= cache_watches + 1, 30, "kubectl's watch to be served by the cache")
        gz_before = metric(chain.rp, "kproxy_compression_input_bytes_total", encoding="gzip")
        writes: list[tuple[list[str], tuple[str, str]]] = [
            (["create", "configmap", "second", "--from-literal=b=2"], ("ADDED", "second")),
            (["label", "configmap", "first", "seen=yes"], ("MODIFIED", "first")),
            (["patch", "configmap", "second", "--type=merge", "-p", '{"data":{"b":"3"}}'], ("MODIFIED", "second")),
            (["delete", "configmap", "first"], ("DELETED", "first")),
        ]
        for count, (write, event) in enumerate(writes, start=1):
            kubectl([*write, "-n", namespace])  # straight on the apiserver
            # Each event is seen before the next write: nothing is held back in a compressor.
            eventually(lambda ev=event: ev in printed(via), 10, f"kubectl through kproxy to print {event}")  # type: ignore[misc]
            assert len(printed(via)) == 1 + count, printed(via)
        eventually(lambda: len(printed(direct)) == 1 + len(writes), 10, "kubectl on the apiserver to print every write")
        assert objects(via.text()) == objects(direct.text())
        assert printed(via) == [("ADDED", "first")] + [event for _, event in writes]
        assert via.proc.poll() is None, via.stop()
        # The events went out gzipped (kubectl asks gzip): once the stream ends (a stream's bytes
        # are counted every 64 codec calls and at its end), the compressor took at least their JSON.
        events_bytes = sum(len(json.dumps(e["object"], separators=(",", ":"))) for e in objects(via.text())[1:])
        via.stop()

        def gzipped() -> float:
            return metric(chain.rp, "kproxy_compression_input_bytes_total", encoding="gzip") - gz_before

        eventually(lambda: gzipped() >= events_bytes, 10, f"{events_bytes} bytes of events counted as gzipped")

        eventually(lambda: len(table(direct_table.text())) == 2 + len(writes), 10, "the table watch on the apiserver")
        eventually(lambda: table(via_table.text()) == table(direct_table.text()), 10, "the same table through kproxy")
        assert [row[0] for row in table(via_table.text())] == ["NAME", "first", "second", "first", "second", "first"]
    finally:
        for kw in (via, direct, via_table, direct_table):
            kw.stop()


# --------------------------------------------------------------------------- policy namespaces


def test_dry_run_namespace_persists_nothing(
    sides: Sides, make_namespace: Callable[[str], str], control_plane: ControlPlaneInfo
) -> None:
    dry = make_namespace("dry")
    reference = make_namespace("kw-ref")
    run = sides.via(["create", "configmap", "preview", "--from-literal=a=1", "-n", dry])
    assert (run.rc, run.out, run.err) == (0, "configmap/preview created\n", DRY_WARNING + "\n"), run
    assert sides.obj("configmap", "preview", dry) is None

    docs = manifests(configmap("settings", a="1"), deployment("web"))
    run = sides.via(["apply", "-f", "-", "-n", dry], docs)
    assert run.rc == 0 and run.out == "configmap/settings created\ndeployment.apps/web created\n", run
    assert run.err == DRY_WARNING + "\n", run  # kubectl prints a repeated warning once
    run = sides.via(["apply", "--server-side", "-f", "-", "-n", dry], docs)
    assert run.rc == 0 and run.out == "configmap/settings serverside-applied\ndeployment.apps/web serverside-applied\n"
    assert run.err == DRY_WARNING + "\n", run  # kubectl prints a repeated warning once
    for kind, name in (("configmap", "settings"), ("deployment", "web"), ("configmap", "preview")):
        assert sides.obj(kind, name, dry) is None, (kind, name)
    status, body = control_plane.request("GET", f"/api/v1/namespaces/{dry}/configmaps")
    assert status == 200 and [i["metadata"]["name"] for i in json.loads(body)["items"]] == []

    # The answer is the apiserver's own dry-run answer: the same object `--dry-run=server` gives.
    run = sides.via(["create", "-f", "-", "-n", dry, "-o", "json"], deployment("web"))
    direct = sides.direct(["create", "-f", "-", "-n", reference, "-o", "json", "--dry-run=server"], deployment("web"))
    assert run.rc == direct.rc == 0
    assert json.loads(mask(run.out, dry)) == json.loads(mask(direct.out, reference))
    assert sides.obj("deployment", "web", reference) is None
    # Reads in the dry-run namespace are untouched (and served as usual).
    run = sides.same(["get", "configmaps,deployments", "-n", dry, "-o", "name"])
    assert "configmap/settings" not in run.out

    # Objects that exist (written straight on the apiserver): every change is a dry run too.
    sides.direct(["apply", "-f", "-", "-n", dry], docs)
    stored = {kind: sides.obj(kind, name, dry) for kind, name in (("configmap", "settings"), ("deployment", "web"))}
    assert all(stored.values()), stored
    changes: list[tuple[list[str], str | None, str]] = [
        (["apply", "-f", "-"], manifests(configmap("settings", a="2"), deployment("web", replicas=9)),
         "configmap/settings configured\ndeployment.apps/web configured\n"),
        (["label", "configmap", "settings", "x=y"], None, "configmap/settings labeled\n"),
        (["scale", "deployment", "web", "--replicas=5"], None, "deployment.apps/web scaled\n"),
        (["patch", "configmap", "settings", "--type=merge", "-p", '{"data":{"a":"3"}}'], None,
         "configmap/settings patched\n"),
        (["delete", "configmap", "settings", "--wait=false"], None,
         f'configmap "settings" deleted from {dry} namespace\n'),
    ]  # fmt: skip
    for args, stdin, printed in changes:
        run = sides.via([*args, "-n", dry], stdin)
        assert (run.rc, run.out, run.err) == (0, printed, DRY_WARNING + "\n"), (args, run)
    for kind, name in (("configmap", "settings"), ("deployment", "web")):
        assert sides.obj(kind, name, dry) == stored[kind], (kind, name)


def test_strict_namespace_rejects_unknown_fields_and_warn_namespace_warns(
    sides: Sides, chain: Chain, make_namespace: Callable[[str], str]
) -> None:
    def local_answers() -> float:
        return metric(chain.rp, "kproxy_validation_requests_total", level="Strict", outcome="rejected")

    before = local_answers()
    strict, strict_ref = make_namespace("strict"), make_namespace("kw-strict-ref")
    warn, warn_ref = make_namespace("kw-warn"), make_namespace("kw-warn-ref")
    bad = yaml.safe_dump({**yaml.safe_load(configmap("bad", a="1")), "bogus": 1})
    bad_dep = yaml.safe_load(deployment("web"))
    bad_dep["spec"]["surprise"] = True
    bad_dep = yaml.safe_dump(bad_dep)

    # kubectl --validate=false sends fieldValidation=Ignore: the Strict rule raises it.
    for doc, kind, name in ((bad, "configmap", "bad"), (bad_dep, "deployment", "web")):
        for verb in (["create"], ["apply"], ["apply", "--server-side"]):
            via = sides.via([*verb, "--validate=false", "-f", "-", "-n", strict], doc)
            direct = sides.direct([*verb, "--validate=strict", "-f", "-", "-n", strict_ref], doc)
            assert via.rc == direct.rc == 1, (verb, via, direct)
            assert mask(via.err, strict) == mask(direct.err, strict_ref), (verb, via.err, direct.err)
            assert via.out == direct.out == ""
            # Server-side apply reports unknown fields its own way, whatever the level.
            assert ("field not declared in schema" if "--server-side" in verb else "unknown field") in via.err
            assert sides.obj(kind, name, strict) is None
    # create and client-side apply POST the object: kproxy answered those itself, whatever filter
    # sits in front of it (transcode asks for protobuf); server-side apply went to the apiserver.
    assert local_answers() - before == 4
    via = sides.via(["create", "--validate=false", "-f", "-", "-n", strict], bad)
    assert via.err == (
        'Error from server (BadRequest): error when creating "STDIN": ConfigMap in version "v1" cannot be handled '
        'as a ConfigMap: strict decoding error: unknown field "bogus"\n'
    )

    # Elsewhere the Warn rule raises Ignore to Warn: the apiserver's warning, and the object is created.
    for doc, kind, name, field in ((bad, "configmap", "bad", "bogus"), (bad_dep, "deployment", "web", "spec.surprise")):
        via = sides.via(["create", "--validate=false", "-f", "-", "-n", warn], doc)
        direct = sides.direct(["create", "--validate=warn", "-f", "-", "-n", warn_ref], doc)
        assert via.rc == direct.rc == 0, (via, direct)
        assert (via.out, via.err) == (direct.out, direct.err), (via, direct)
        assert via.err == f'Warning: unknown field "{field}"\n', via.err
        created = sides.obj(kind, name, warn)
        assert created is not None and created == sides.obj(kind, name, warn_ref)
        assert field.rsplit(".", 1)[-1] not in json.dumps(created["spec" if kind == "deployment" else "data"])
