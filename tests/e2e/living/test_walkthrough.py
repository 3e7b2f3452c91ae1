"""``make run``'s walk-through works as printed: each command, pasted into bash, shows what it says.

``kproxy envtest run`` (what ``make run`` executes) is started as a process with a copy of
config.recommended.yaml on free ports; the setup lines and the commands are taken from what it
printed, run with bash, and each step's promise is checked (and, for the policies, the verdict at
the apiserver). Ctrl-C (SIGINT) must then stop everything it started.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kproxy.localcluster import envtest, walkthrough
from kproxy.localcluster.processes import free_ports

REPO = Path(__file__).resolve().parents[3]


class Printed:
    def __init__(self, proc: subprocess.Popen[str], directory: Path) -> None:
        self.proc = proc
        self.dir = directory
        self.lines: list[str] = []

    def read_until(self, marker: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("kproxy envtest run exited:\n" + "".join(self.lines))
            self.lines.append(line)
            if marker in line:
                return
        raise AssertionError(f"no {marker!r} in time:\n" + "".join(self.lines))

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def setup(self) -> str:
        """The printed ``export KUBECONFIG=...`` and ``k=...; admin=...`` lines."""
        lines = [ln.strip() for ln in self.lines if ln.strip().startswith(("export KUBECONFIG=", "k="))]
        assert len(lines) == 2, self.text
        return "\n".join(lines)

    def commands(self, number: int) -> list[str]:
        """The commands printed under step ``number``."""
        out: list[str] = []
        inside = False
        for ln in self.lines:
            if re.match(rf"^{number}\. ", ln):
                inside = True
            elif inside and ln.startswith("     "):
                out.append(ln.strip())
            elif inside and ln.strip().startswith("->"):
                break
        assert out, self.text
        return out

    def bash(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", self.setup() + "\n" + command], capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Printed]:
    tmp = tmp_path_factory.mktemp("walkthrough")
    listen, admin = free_ports(2)
    cfg = yaml.safe_load((REPO / "config.recommended.yaml").read_text())
    cfg["listen"], cfg["admin_listen"] = f"127.0.0.1:{listen}", f"127.0.0.1:{admin}"
    config = tmp / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    directory = tmp / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy.cli", "envtest", "run", "--dir", str(directory), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = Printed(proc, directory)
    try:
        out.read_until("Ctrl-C here stops", timeout=180)
        yield out
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        envtest.down(directory)


def _apiserver(printed: Printed) -> envtest.ControlPlaneInfo:
    return envtest.load(printed.dir)


def test_step1_cached_watch_shows_pods_running(printed: Printed) -> None:
    create, scale, watch = printed.commands(1)
    assert "get pods -w -o custom-columns=" in watch
    assert printed.bash(create).returncode == 0
    assert printed.bash(scale).returncode == 0
    before = _apiserver_watches(printed, "pods")
    proc = subprocess.Popen(["bash", "-c", printed.setup() + "\nexec " + watch], stdout=subprocess.PIPE, text=True)
    running: set[str] = set()
    deadline = time.monotonic() + 90
    try:
        assert proc.stdout is not None
        while len(running) < 6 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            cols = line.split()
            if len(cols) >= 3 and cols[0].startswith("web-") and cols[1] == "Running":
                running.add(cols[0])
        # kubectl's watch is served from kproxy's cache: the apiserver holds no more watches of pods than
        # before it (kproxy's one, and the apiserver's own), however many clients watch through kproxy.
        during = _apiserver_watches(printed, "pods")
    finally:
        proc.kill()
        proc.wait()
    assert len(running) == 6, running
    assert during == before


def _apiserver_watches(printed: Printed, resource: str) -> float:
    code, body = _apiserver(printed).request("GET", "/metrics")
    assert code == 200
    total = 0.0
    wanted = ('verb="WATCH"', f'resource="{resource}"', 'group=""')
    for line in body.decode().splitlines():
        if line.startswith("apiserver_longrunning_requests{") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_step2_dry_namespace_keeps_nothing(printed: Printed) -> None:
    create, get = printed.commands(2)
    made = printed.bash(create)
    assert made.returncode == 0, made.stderr
    assert "configmap/kept created" in made.stdout
    assert 'kproxy dryrun rule "dry-namespaces"' in made.stderr
    got = printed.bash(get)
    assert got.returncode == 1 and "NotFound" in got.stderr
    code, _ = _apiserver(printed).request("GET", "/api/v1/namespaces/dry-demo/configmaps/kept")
    assert code == 404


def test_step3_strict_namespace_refuses_unknown_field(printed: Printed) -> None:
    (command,) = printed.commands(3)
    out = printed.bash(command)
    assert out.returncode == 1
    assert 'strict decoding error: unknown field "dataa"' in out.stderr
    code, _ = _apiserver(printed).request("GET", "/api/v1/namespaces/strict-demo/configmaps/typo")
    assert code == 404


def test_step4_metrics_show_savings_and_cached_watches(printed: Printed) -> None:
    (command,) = printed.commands(4)
    out = printed.bash(command)
    assert out.returncode == 0, out.stderr
    values: dict[str, float] = {}
    for line in out.stdout.splitlines():
        name, _, value = line.rpartition(" ")
        values[name] = float(value)
    sent_in = sum(v for k, v in values.items() if k.startswith("kproxy_compression_input_bytes_total"))
    sent_out = sum(v for k, v in values.items() if k.startswith("kproxy_compression_output_bytes_total"))
    assert sent_in > 2 * sent_out > 0, values
    assert values.get('kproxy_watchcache_watches{resource="pods"}', 0) >= 1, values


def test_ctrl_c_stops_everything(printed: Printed) -> None:
    pids = json.loads((printed.dir / "state.json").read_text())
    printed.proc.send_signal(signal.SIGINT)
    rest, _ = printed.proc.communicate(timeout=60)
    assert printed.proc.returncode == 0
    assert "stopped kproxy, the controllers, kwok, kube-apiserver and etcd" in rest
    assert not envtest.status(printed.dir).has_state
    for proc in [pids["etcd"], pids["apiserver"], *pids["extras"].values()]:
        assert not Path(f"/proc/{proc['pid']}").exists() or _zombie(proc["pid"])
    assert walkthrough.DEMO_NAMESPACES  # the demo namespaces were part of what ran


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] in ("Z", "X")
    except OSError:
        return True
