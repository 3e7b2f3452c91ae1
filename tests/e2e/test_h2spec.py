"""h2spec, the HTTP/2 conformance tester (its Go module, built by tools/h2spec/build.sh), against
Go's server in front of the real kube-apiserver and against kproxy's TLS listener in front of it.

The apiserver's server (golang.org/x/net/http2) fails a few of h2spec's 145 cases on purpose (it
hangs up on a SETTINGS frame that repeats a setting, and answers requests carrying
connection-specific header fields instead of resetting them); kproxy may fail those too, and no
other: every case kproxy fails must be one the apiserver fails.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
H2SPEC_TOOL = REPO / "tools" / "h2spec"
#: h2spec's own per-case timeout (seconds) and the bound on one whole run.
CASE_TIMEOUT = 2
RUN_TIMEOUT = 240
#: h2spec 2.2.1's case count (generic, http2 and hpack suites).
CASES = 145
#: The cases Go's server fails by design: a SETTINGS frame repeating a setting (it closes the
#: connection), and two requests with connection-specific header fields (it answers them).
GO_FAILS = frozenset(("http2/6.5.3/1", "http2/8.1.2.2/1", "http2/8.1.2.2/2"))


def h2spec_version() -> str:
    found = re.search(
        r"^\s*(?:require\s+)?github\.com/summerwind/h2spec\s+(v\S+)", (H2SPEC_TOOL / "go.mod").read_text(), re.MULTILINE
    )
    assert found, "no github.com/summerwind/h2spec pin in tools/h2spec/go.mod"
    return found.group(1)


@pytest.fixture(scope="session")
def h2spec() -> Path:
    """$KPROXY_H2SPEC_BIN (set by the Makefile), else ~/.cache/kproxy/h2spec/<pin>/h2spec, built
    (under a lock) if missing."""
    if override := os.environ.get("KPROXY_H2SPEC_BIN"):
        return Path(override)
    version = h2spec_version()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kproxy" / "h2spec" / version
    binary = cache / "h2spec"

    def ready() -> bool:
        version_file = cache / "VERSION"
        return os.access(binary, os.X_OK) and version_file.is_file() and version_file.read_text().strip() == version

    if not ready():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{cache}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not ready():
                subprocess.run(["bash", str(H2SPEC_TOOL / "build.sh"), str(cache)], check=True)
    return binary


@dataclass(frozen=True)
class Report:
    cases: int
    #: failed cases by h2spec's id ("http2/4.2/1") -> the case's title and h2spec's message
    failures: dict[str, str]
    output: str


def run_h2spec(h2spec: Path, port: int, report: Path, case: str | None = None) -> Report:
    """h2spec's cases (all, or the one with this id) over TLS (ALPN h2) against 127.0.0.1:port,
    read from its JUnit report."""
    cases = [case] if case else []
    args = ["-t", "-k", "-h", "127.0.0.1", "-p", str(port), "-o", str(CASE_TIMEOUT), "-j", str(report)]
    proc = subprocess.run(
        [str(h2spec), *args, *cases],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    if not report.exists():
        raise AssertionError(f"h2spec wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr}")
    count = 0
    failures: dict[str, str] = {}
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for index, test in enumerate(suite.iter("testcase"), 1):
            count += 1
            bad = test.find("failure")
            if bad is None:
                bad = test.find("error")
            if bad is not None or test.find("skipped") is not None:
                text = (bad.text or bad.get("message") or "") if bad is not None else "skipped"
                failures[case or f"{suite.get('package')}/{index}"] = (
                    f"{test.get('classname')}: " + " ".join(text.split())[:300]
                )
    return Report(count, failures, proc.stdout)


@pytest.fixture(scope="module")
def apiserver_report(h2spec: Path, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Report:
    return run_h2spec(h2spec, control_plane.apiserver_port, tmp_path_factory.mktemp("h2spec") / "apiserver.xml")


@pytest.fixture(scope="module")
def tls_proxy(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy's TLS listener forwarding callers' credentials (h2spec sends none: the apiserver
    answers it as anonymous, through kproxy as directly)."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-h2spec"), control_plane.admin_kubeconfig, credentials="forward", tls=True
    )
    yield rp
    rp.stop()


def test_h2spec_against_the_apiserver(
    h2spec: Path, apiserver_report: Report, control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    """The reference: h2spec runs all its cases against Go's server, which fails only a handful.
    Some cases race the server's scheduling under load (5.1.2/1, streams over the limit; 6.9.1/3,
    a window opened by SETTINGS, answered after h2spec's 2 s): as for kproxy, a case beyond those
    Go fails by design is run twice more, on its own, and counts when it fails every time."""
    assert apiserver_report.cases == CASES, apiserver_report.output[-3000:]
    failures = dict(apiserver_report.failures)
    for case in [c for c in failures if c not in GO_FAILS]:
        for attempt in range(2):
            again = run_h2spec(
                h2spec, control_plane.apiserver_port, tmp_path / f"{case.replace('/', '_')}-{attempt}.xml", case
            )
            if case not in again.failures:
                del failures[case]
                break
    assert len(failures) <= 4, "\n".join(f"- {k} {v}" for k, v in sorted(failures.items()))


def test_h2spec_against_kproxy(h2spec: Path, apiserver_report: Report, tls_proxy: RunningProxy, tmp_path: Path) -> None:
    """kproxy's TLS listener fails no h2spec case that the apiserver's own server passes. Some
    cases race the server's scheduling (the apiserver fails 5.1.2/1, streams over the limit, in
    about one run in three): a case kproxy fails alone is run twice more, on its own, and counts
    when it fails every time."""
    port = int(tls_proxy.url.rsplit(":", 1)[1])
    report = run_h2spec(h2spec, port, tmp_path / "kproxy.xml")
    assert report.cases == CASES, report.output[-3000:]
    extra = {k: v for k, v in report.failures.items() if k not in apiserver_report.failures}
    for case in list(extra):
        for attempt in range(2):
            if (
                case
                not in run_h2spec(h2spec, port, tmp_path / f"{case.replace('/', '_')}-{attempt}.xml", case).failures
            ):
                del extra[case]
                break
    assert not extra, "h2spec cases kproxy fails and the apiserver passes:\n" + "\n".join(
        f"- {k} {v}" for k, v in sorted(extra.items())
    )
    assert tls_proxy.proc.poll() is None, tls_proxy.log_text()[-3000:]
