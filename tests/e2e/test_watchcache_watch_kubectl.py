"""`kubectl get pods --watch` through kproxy's watch cache prints the initial pods and then the changes,
exactly as it does straight against the apiserver.

The same kubectl watch runs twice at once, once on the apiserver and once through kproxy, while a
writer relabels, creates and deletes pods; the two outputs are compared (tables without the AGE
column, JSON objects whole). kproxy's metrics show that its cache served the watch.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_watchcache_outage import CACHE_PODS, Writer, metric

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def watches(rp: RunningProxy, served: str) -> float:
    """Pod watches kproxy counted as served by ``served`` (``cache`` or ``upstream``)."""
    reason = {"reason": "media type"} if served == "upstream" else {}
    return metric(rp, "kproxy_watchcache_reads_total", resource="pods", verb="watch", served=served, **reason)


class KubectlWatch:
    """A running ``kubectl get --watch``; its output is collected as it is printed."""

    def __init__(self, cp: ControlPlaneInfo, kubeconfig: Path, args: list[str], cache_dir: Path) -> None:
        argv = [str(cp.kubectl), f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}", *args]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._out = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            with self._lock:
                self._out += chunk

    def text(self) -> str:
        with self._lock:
            return self._out.decode()

    def stop(self) -> str:
        """Stop kubectl; its stderr (for failure messages)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")


def table(text: str) -> list[list[str]]:
    """kubectl's table rows split into cells, without the AGE column (it moves with the clock)."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    if not rows:
        return rows
    age = rows[0].index("AGE")
    return [row[:age] + row[age + 1 :] for row in rows]


def objects(text: str) -> list[Any]:
    """kubectl's ``-o json --watch`` output: one JSON document after another."""
    decoder, at = json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out
        try:
            doc, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return out  # a document still being printed
        out.append(doc)


@pytest.fixture
def kubectl_watches(tmp_path: Path) -> Iterator[Callable[..., KubectlWatch]]:
    started: list[KubectlWatch] = []

    def make(cp: ControlPlaneInfo, kubeconfig: Path, args: list[str]) -> KubectlWatch:
        kw = KubectlWatch(cp, kubeconfig, args, tmp_path / f"kubectl-cache-{len(started)}")
        started.append(kw)
        return kw

    yield make
    for kw in started:
        kw.stop()


#: (kubectl flags, output parser, how many pods/events printed, who serves the watch). kubectl's
#: default table output asks the apiserver for ``as=Table`` (server-side printing): a conversion the
#: cache leaves to the apiserver, counted as ``served="upstream",reason="media type"``; with
#: ``--server-print=false`` or ``-o json`` kubectl watches plain JSON, which the cache serves.
CASES: list[tuple[list[str], Callable[[str], Any], Callable[[Any], int], str]] = [
    ([], table, lambda rows: len(rows) - 1, "upstream"),
    (["--output-watch-events"], table, lambda rows: len(rows) - 1, "upstream"),
    (["--server-print=false"], table, lambda rows: len(rows) - 1, "cache"),
    (["--server-print=false", "--output-watch-events"], table, lambda rows: len(rows) - 1, "cache"),
    (["-o", "json"], objects, len, "cache"),
    (["-o", "json", "--output-watch-events"], objects, len, "cache"),
]


@pytest.mark.parametrize(("extra", "parse", "count", "served"), CASES, ids=[" ".join(c[0]) or "table" for c in CASES])
def test_kubectl_get_watch_through_cache(
    proxy_factory: Callable[..., RunningProxy],
    control_plane: ControlPlaneInfo,
    namespace: str,
    kubectl_watches: Callable[..., KubectlWatch],
    extra: list[str],
    parse: Callable[[str], Any],
    count: Callable[[Any], int],
    served: str,
) -> None:
    cp = control_plane
    writer = Writer(cp, namespace)
    writer.create("a")
    writer.create("b")
    rp = proxy_factory(extra=CACHE_PODS)
    eventually(lambda: rp.get(f"/api/v1/namespaces/{namespace}/pods")[0] == 200, 60, "the pods cache to be ready")
    before = watches(rp, served)

    args = ["get", "pods", "-n", namespace, "--watch", *extra]
    direct = kubectl_watches(cp, cp.admin_kubeconfig, args)
    via = kubectl_watches(cp, rp.kubeconfig, args)
    for kw in (direct, via):

        def initial(kw: KubectlWatch = kw) -> bool:
            return count(parse(kw.text())) >= 2

        eventually(initial, 30, "kubectl to print the initial pods")
    eventually(lambda: watches(rp, served) >= before + 1, 30, f"kubectl's watch counted as served={served!r}")

    writer.modify("a")  # MODIFIED a
    writer.create("c")  # ADDED c
    writer.delete("b")  # MODIFIED b (deletionTimestamp), DELETED b
    eventually(lambda: count(parse(direct.text())) >= 6, 30, "kubectl straight on the apiserver to print 4 changes")

    def same() -> bool:
        return bool(parse(via.text()) == parse(direct.text()))

    try:
        eventually(same, 30, "kubectl through kproxy to print the same as straight on the apiserver")
    except AssertionError as e:
        raise AssertionError(f"{e}\ndirect:\n{direct.text()}\nvia kproxy:\n{via.text()}\n{via.stop()}") from None
    printed = parse(via.text())
    if parse is objects:
        names = [doc.get("object", doc)["metadata"]["name"] for doc in printed]
    else:
        column = printed[0].index("NAME")
        names = [row[column] for row in printed[1:]]
    assert names == ["a", "b", "a", "c", "b", "b"], printed
    assert via.proc.poll() is None, "kubectl's watch through kproxy ended"
    assert watches(rp, served) == before + 1
    other = "cache" if served == "upstream" else "upstream"
    assert watches(rp, other) == 0, f"a watch was also served={other!r}"
