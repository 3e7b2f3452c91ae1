"""Conditional requests (``If-None-Match``) through the full chain, as the apiserver answers them.

The apiserver sets a strong ``ETag`` on the documents clients poll and cache: ``/openapi/v2``
(kube-openapi pkg/handler/handler.go, wrapped in NYTimes gziphandler), ``/openapi/v3/<gv>``
(pkg/handler3/handler.go) — both answer ``If-None-Match`` through Go's ``http.ServeContent``
(net/http/fs.go ``checkIfNoneMatch``, weak comparison) — and aggregated discovery ``/api`` and
``/apis`` (k8s.io/apiserver pkg/endpoints/discovery/aggregated/etag.go ``ServeHTTPWithETag``,
which compares the first ``If-None-Match`` line with ``"<hash>"`` as an exact string). When the
apiserver gzips one of them (responsewriters/writers.go, gziphandler) the tag stays as it is.

So a tag that kproxy changed on the way out is one the apiserver no longer recognises on the way
in, whatever kproxy does to map it back: a client that revalidates with another Accept-Encoding
(kubectl with ``--disable-compression`` over a cache filled without it) or that rebuilds the
tag itself (the upstream e2e suite's OpenAPI poller) gets the whole document again. Each test
sends the same requests straight to the apiserver and through kproxy with every built-in filter
(tests/e2e/full_chain.py) and wants the same 304s, answered by the apiserver.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import urllib3
from full_chain import FILTERS
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
#: path -> the Accept header a client sends for it (kubectl's for discovery; none for OpenAPI,
#: as the e2e suite's poller sends none: kube-openapi then serves JSON).
DOCUMENTS = {
    "/openapi/v2": None,
    "/openapi/v3/api/v1": "application/json",
    "/apis": DISCOVERY,
}
#: The apiserver's request metric labels non-resource paths by ``subresource``; /openapi/v2 is
#: served outside that instrumentation, so its 304s are seen in the answer only.
METRIC_PATH = {"/openapi/v3/api/v1": "openapi/v3/", "/apis": "apis", "/api": "api"}


@dataclass
class Answer:
    status: int
    etag: str | None
    coding: str | None
    wire_bytes: int  # the body as sent (before any Content-Encoding is undone)


class Side:
    """Raw HTTPS requests with the admin token to one side, bodies counted as they travel."""

    def __init__(self, base: str, ca_file: Path, token: str) -> None:
        self.base = base.rstrip("/")
        self.token = token
        self.pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(ca_file), retries=False)

    def get(self, path: str, headers: dict[str, str | None]) -> Answer:
        hdrs = {"Authorization": f"Bearer {self.token}"}
        hdrs.update({k: v for k, v in headers.items() if v is not None})
        # urllib3 adds no Accept-Encoding of its own: absent means absent.
        resp = self.pool.request("GET", self.base + path, headers=hdrs, preload_content=False, timeout=60)
        data = resp.read(decode_content=False)
        resp.release_conn()
        return Answer(resp.status, resp.headers.get("ETag"), resp.headers.get("Content-Encoding"), len(data))


@pytest.fixture(scope="module")
def chain(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy with every built-in filter (compression with watches, transcode, dryrun,
    validation, watchcache), `credentials: forward` over TLS."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-conditional"),
        control_plane.admin_kubeconfig,
        credentials="forward",
        tls=True,
        extra={"filters": FILTERS},
    )
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def sides(control_plane: ControlPlaneInfo, chain: RunningProxy) -> dict[str, Side]:
    assert chain.ca_file is not None
    return {
        "direct": Side(control_plane.server, control_plane.ca_file, control_plane.admin_token),
        "kproxy": Side(chain.url, chain.ca_file, control_plane.admin_token),
    }


def apiserver_304s(cp: ControlPlaneInfo) -> Counter[str]:
    """The apiserver's own count of 304 answers, by metric path (apiserver_request_total).
    Only those lines are read: the whole exposition takes seconds to parse."""
    code, body = cp.request("GET", "/metrics")
    assert code == 200
    out: Counter[str] = Counter()
    for line in body.decode().splitlines():
        if line.startswith("apiserver_request_total{") and 'code="304"' in line:
            labels, _, value = line.rpartition(" ")
            found = re.search(r'subresource="([^"]*)"', labels)
            out[found.group(1) if found else ""] += int(float(value))
    return out


def _headers(path: str, coding: str | None, if_none_match: str | None = None) -> dict[str, str | None]:
    return {"Accept": DOCUMENTS[path], "Accept-Encoding": coding, "If-None-Match": if_none_match}


# --------------------------------------------------------------------------- the tag itself


@pytest.mark.parametrize("coding", ["gzip", "zstd", None])
@pytest.mark.parametrize("path", list(DOCUMENTS))
def test_etag_is_the_apiservers(sides: dict[str, Side], path: str, coding: str | None) -> None:
    """The validator a client stores through kproxy is the apiserver's, compressed or not: the
    apiserver keeps it strong when it gzips, and it is the only spelling its handlers match."""
    direct = sides["direct"].get(path, _headers(path, coding))
    through = sides["kproxy"].get(path, _headers(path, coding))
    assert direct.status == through.status == 200
    assert direct.etag is not None and direct.etag.startswith('"')
    if coding is not None:
        assert through.coding == coding  # the case in question: kproxy compressed it
    assert through.etag == direct.etag


# --------------------------------------------------------------------------- revalidation


@pytest.mark.parametrize(("first", "again"), [("gzip", "gzip"), ("gzip", None), (None, "gzip"), (None, None)])
@pytest.mark.parametrize("path", list(DOCUMENTS))
def test_if_none_match_answered_304_by_the_apiserver(
    control_plane: ControlPlaneInfo, sides: dict[str, Side], path: str, first: str | None, again: str | None
) -> None:
    """A client revalidates with the tag it was given, with gzip on or off each time (a cache
    shared by clients that differ in it): the apiserver answers 304, as it does directly."""
    answers = {}
    for name, side in sides.items():
        got = side.get(path, _headers(path, first))
        assert got.status == 200 and got.etag
        before = apiserver_304s(control_plane)
        answers[name] = side.get(path, _headers(path, again, got.etag))
        if path in METRIC_PATH and answers[name].status == 304:
            # Answered by the apiserver, not made up on the way (other tests may add more).
            assert apiserver_304s(control_plane)[METRIC_PATH[path]] > before[METRIC_PATH[path]]
    assert answers["direct"].status == 304
    assert answers["kproxy"].status == 304, f"{path}: {first} then {again}: {answers}"
    assert answers["kproxy"].wire_bytes == 0


def _e2e_poller_tag(etag: str) -> str:
    """The If-None-Match the upstream e2e suite's OpenAPI poller sends back: it keeps
    ``strings.Trim(resp.Header.Get("ETag"), `"`)`` and sends ``fmt.Sprintf(`"%s"`, etag)``
    (test/e2e/apimachinery/crd_publish_openapi.go, waitForOpenAPISchema)."""
    return '"' + etag.strip('"') + '"'


@pytest.mark.parametrize("coding", ["gzip", None])
@pytest.mark.parametrize("path", list(DOCUMENTS))
def test_openapi_poller_gets_304(sides: dict[str, Side], path: str, coding: str | None) -> None:
    """The e2e suite's OpenAPI poller (Go's transport asks for gzip; ``coding=None`` is
    DisableCompression) rebuilds the tag from its hash: its second poll is a 304 through kproxy
    as it is directly (the seven CustomResourcePublishOpenAPI specs poll /openapi/v2 this way)."""
    statuses = {}
    for name, side in sides.items():
        got = side.get(path, _headers(path, coding))
        assert got.status == 200 and got.etag
        statuses[name] = side.get(path, _headers(path, coding, _e2e_poller_tag(got.etag))).status
    assert statuses == {"direct": 304, "kproxy": 304}


# --------------------------------------------------------------------------- kubectl's disk cache


@dataclass
class KubectlRun:
    """What one kubectl command asked of discovery and OpenAPI: (path, status) -> count."""

    answers: Counter[tuple[str, int]]
    apiserver_304s: int  # the apiserver's 304s on /api, /apis, /openapi/v3/* meanwhile

    def count(self, status: int) -> int:
        return sum(n for (_path, code), n in self.answers.items() if code == status)

    def paths(self, status: int) -> set[str]:
        return {path for (path, code) in self.answers if code == status}


def _kproxy_requests(rp: RunningProxy) -> int:
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for s in family.samples:
            if s.name == "kproxy_requests_total":
                total += s.value
    return int(total)


def _access_lines(rp: RunningProxy) -> list[dict[str, object]]:
    out = []
    for line in rp.log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("logger") == "kproxy.access":
            out.append(rec)
    return out


def _kubectl(
    cp: ControlPlaneInfo, kubeconfig: Path, cache_dir: Path, args: list[str], compression: bool, rp: RunningProxy | None
) -> KubectlRun:
    """Run kubectl with ``cache_dir``; count what reached kproxy (its access log) and the
    apiserver's 304s while it ran."""
    seen = len(_access_lines(rp)) if rp is not None else 0
    requests = _kproxy_requests(rp) if rp is not None else 0
    before = apiserver_304s(cp)
    argv = [str(cp.kubectl), f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}", *args]
    if not compression:
        argv.append("--disable-compression=true")
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    answers: Counter[tuple[str, int]] = Counter()
    if rp is not None:
        # The access line is written as the request ends: wait until kproxy counted as many.
        eventually(lambda: len(_access_lines(rp)) - seen == _kproxy_requests(rp) - requests, 10, "access log")
        for rec in _access_lines(rp)[seen:]:
            _method, target, code = str(rec["msg"]).split(" ")
            answers[(target.split("?")[0], int(code))] += 1
    after = apiserver_304s(cp)
    return KubectlRun(answers, sum(after[k] - before[k] for k in ("api", "apis", "openapi/v3/")))


def _proxy_kubeconfig(tmp: Path, rp: RunningProxy, token: str) -> Path:
    out = tmp / "kproxy.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kproxy", "cluster": {"server": rp.url, "certificate-authority": str(rp.ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "kproxy", "context": {"cluster": "kproxy", "user": "admin"}}],
        "current-context": "kproxy",
    }
    out.write_text(json.dumps(config))
    return out


def test_kubectl_disk_cache_revalidates_with_304s(
    control_plane: ControlPlaneInfo, chain: RunningProxy, tmp_path: Path
) -> None:
    """kubectl's discovery cache (aggregated /api and /apis, through httpcache) revalidates what
    a first run stored: run twice as usual, then once more with ``--disable-compression`` (the
    same cache directory, as a second client on the machine would use it). Each later run is
    answered 304 by the apiserver for both discovery documents, through kproxy as directly.
    ``kubectl explain`` then reads OpenAPI v3: the index (no ETag in v1.37) each time, the
    group version's document (by hash, ``Cache-Control: public, immutable``) once."""
    kubeconfig = _proxy_kubeconfig(tmp_path, chain, control_plane.admin_token)
    runs: dict[str, list[KubectlRun]] = {"direct": [], "kproxy": []}
    steps = [
        (["api-resources"], True),
        (["api-resources"], True),
        (["api-resources"], False),
        (["explain", "pods"], True),
        (["explain", "pods"], True),
    ]
    for side, config, rp in (
        ("direct", control_plane.admin_kubeconfig, None),
        ("kproxy", kubeconfig, chain),
    ):
        cache = tmp_path / f"cache-{side}"  # fresh, one per side
        for args, compression in steps:
            runs[side].append(_kubectl(control_plane, config, cache, args, compression, rp))
    through = runs["kproxy"]
    assert through[0].count(304) == 0 and through[0].paths(200) >= {"/api", "/apis"}
    for i, run in enumerate(through[1:3], start=1):
        assert run.paths(304) == {"/api", "/apis"}, f"run {i + 1}: {dict(run.answers)}"
        assert run.count(200) == 0, f"run {i + 1}: {dict(run.answers)}"
        assert run.apiserver_304s >= 2  # answered by the apiserver (other tests may add more)
    # Directly the apiserver answered at least as many 304s in the same runs (it may see more:
    # the control plane is shared).
    for i in (1, 2):
        assert runs["direct"][i].apiserver_304s >= 2
    assert through[3].answers == Counter({("/openapi/v3", 200): 1, ("/openapi/v3/api/v1", 200): 1})
    # The group version's document comes from the cache; the index is fetched again (a 304 when the
    # apiserver gave it an ETag, a 200 when not: both are the apiserver's own answers, passed through).
    assert sum(through[4].answers.values()) == 1
    assert set(through[4].answers) <= {("/openapi/v3", 200), ("/openapi/v3", 304)}, through[4].answers
