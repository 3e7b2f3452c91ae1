"""exec, attach and port-forward end to end: client -> kproxy -> real kube-apiserver -> stand-in kubelet.

``standin-kubelet`` (tools/envtest/standin-kubelet; kproxy/testing/standin_kubelet.py) serves the
kubelet's streaming endpoints with the kubelet's own code, so the apiserver upgrades and proxies
these requests exactly as it does in a cluster: WebSocket ``v5.channel.k8s.io`` from kubectl is
translated by the apiserver to SPDY towards the kubelet, SPDY (kubectl's fallback) and WebSocket
``v4.channel.k8s.io`` (the Python client) are proxied as they are, and port-forward goes over
the apiserver's WebSocket tunnel or SPDY. Every command runs through kproxy and straight on the
apiserver and the two results are compared (and checked against what the command must do, so
both sides failing alike does not pass). Two kproxies: `credentials: proxy` with an empty chain,
and every built-in filter (tests/e2e/full_chain.py) with `credentials: forward` over TLS:
upgrades must pass every filter untouched.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import socket
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from full_chain import DRY_RULE, FILTERS, api_client
from kubernetes import client, config
from kubernetes.stream import stream

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import free_ports
from kproxy.testing.proxyproc import ALLOW_EXEC, RunningProxy, start_proxy
from kproxy.testing.standin_kubelet import StandInNode

POD = "box"
BANNER = "attached to banner\n"
SIDES = ("direct", "kproxy")


@dataclass
class Target:
    """The pod's namespace and how to reach the apiserver directly and through one kproxy."""

    cp: ControlPlaneInfo
    ns: str
    rp: RunningProxy
    kproxy_token: str | None  # bearer token for the Python client (forward mode), else the kubeconfig's

    def kubeconfig(self, side: str) -> Path:
        return self.cp.admin_kubeconfig if side == "direct" else self.rp.kubeconfig

    def api(self, side: str) -> client.CoreV1Api:
        if side == "direct":
            return client.CoreV1Api(config.new_client_from_config(str(self.cp.admin_kubeconfig)))
        if self.kproxy_token is not None:
            assert self.rp.ca_file is not None
            return client.CoreV1Api(api_client(self.rp.url, self.rp.ca_file, self.kproxy_token))
        return client.CoreV1Api(config.new_client_from_config(str(self.rp.kubeconfig)))


@pytest.fixture(scope="module")
def node(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInNode]:
    """The stand-in kubelet with pod ``box``: containers ``main`` (stdin), ``term`` (stdin, tty) and
    ``banner`` (attach prints a line and a line on stderr, then echoes stdin)."""
    n = StandInNode(
        control_plane,
        tmp_path_factory.mktemp("standin-kubelet"),
        attach={"banner": f"printf '{BANNER}'; echo banner-err >&2; cat"},
    )
    yield n
    n.close()


CONTAINERS = [
    {"name": "main", "stdin": True},
    {"name": "term", "stdin": True, "tty": True},
    {"name": "banner", "stdin": True},
]


@pytest.fixture(scope="module")
def namespace(node: StandInNode) -> str:
    """``strict-*``: the full chain's validation rule is Strict there (its dryrun rule is not)."""
    ns = node.namespace("strict-exec")
    node.pod(ns, POD, CONTAINERS)
    return ns


@pytest.fixture(scope="module")
def dry_namespace(node: StandInNode) -> str:
    """``dry-*``: the full chain's dryrun rule enforces dry runs there."""
    ns = node.namespace("dry-exec")
    node.pod(ns, POD, CONTAINERS)
    return ns


@pytest.fixture(scope="module", params=["empty-chain", "full-chain"])
def target(
    request: pytest.FixtureRequest,
    control_plane: ControlPlaneInfo,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Target]:
    cp = control_plane
    tmp = tmp_path_factory.mktemp(f"kproxy-exec-{request.param}")
    if request.param == "empty-chain":
        rp = start_proxy(tmp, cp.admin_kubeconfig, extra={"proxy": ALLOW_EXEC})
        token = None
    else:
        extra = {"filters": FILTERS}
        rp = start_proxy(tmp, cp.admin_kubeconfig, credentials="forward", tls=True, token=cp.admin_token, extra=extra)
        token = cp.admin_token
    yield Target(cp, namespace, rp, token)
    rp.stop()


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    """A local TCP echo server: what the pod's port is, through port-forward."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


# --------------------------------------------------------------------------- kubectl


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str


def kubectl(
    t: Target, side: str, args: list[str], *, input: str | None = None, env: Mapping[str, str] | None = None
) -> Run:
    argv = [str(t.cp.kubectl), f"--kubeconfig={t.kubeconfig(side)}", "-n", t.ns, *args]
    proc = subprocess.run(
        argv,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def both(t: Target, args: list[str], **kw: Any) -> Run:
    """Run through kproxy and directly; they must agree. Returns the direct run."""
    direct, proxied = (kubectl(t, side, args, **kw) for side in SIDES)
    assert proxied == direct
    return direct


SPDY = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
TRANSPORTS = {"websocket": {}, "spdy": SPDY}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_stdout_stderr_exit_code(target: Target, transport: str) -> None:
    run = both(
        target,
        ["exec", POD, "-c", "main", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
        env=TRANSPORTS[transport],
    )
    assert (run.rc, run.out) == (3, "out\n")
    assert run.err == "err\ncommand terminated with exit code 3\n"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_stdin(target: Target, transport: str) -> None:
    data = "".join(f"line {i} {'x' * (i % 97)}\n" for i in range(5000))  # ~250 KiB, many frames
    run = both(
        target,
        ["exec", "-i", POD, "-c", "main", "--", "sh", "-c", "cat; echo done >&2"],
        input=data,
        env=TRANSPORTS[transport],
    )
    assert (run.rc, run.out, run.err) == (0, data, "done\n")


def test_exec_default_container(target: Target) -> None:
    run = both(target, ["exec", POD, "--", "echo", "hello"])
    assert (run.rc, run.out) == (0, "hello\n")
    assert run.err == 'Defaulted container "main" out of: main, term, banner\n'


def test_exec_in_dry_run_namespace(target: Target, dry_namespace: str) -> None:
    """Under ``enforce`` the dryrun filter refuses exec (it cannot be a dry run; docs/using/dryrun.md) with
    a 403 naming the rule, before the apiserver dials the kubelet; without the filter it runs."""
    t = Target(target.cp, dry_namespace, target.rp, target.kproxy_token)
    args = ["exec", POD, "-c", "main", "--", "echo", "ran"]
    direct, proxied = (kubectl(t, side, args) for side in SIDES)
    assert direct == Run(0, "ran\n", "")
    if "dryrun" not in json.dumps(target.rp.config.get("filters")):
        assert proxied == direct
        return
    assert (proxied.rc, proxied.out) == (1, "")
    # kubectl's words for a 403 Status answering an upgrade, as for an RBAC refusal by the apiserver.
    refusal = f'pods "{POD}" is forbidden: kproxy dryrun rule "{DRY_RULE}": pods/exec cannot be run as a dry run'
    assert proxied.err == f"error: unable to upgrade connection: {refusal}\n"


def test_exec_unknown_container(target: Target) -> None:
    run = both(target, ["exec", POD, "-c", "nope", "--", "true"])
    assert run.rc == 1 and "container nope is not valid" in run.err


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exec_tty_with_resize(target: Target, transport: str) -> None:
    """``-t`` from a real terminal: the remote side sees a tty of the local terminal's size (the
    resize channel works), and the output comes back through the tty (CRLF line ends)."""
    outs = [_exec_in_pty(target, side, 37, 111, TRANSPORTS[transport]) for side in SIDES]
    assert outs[0] == outs[1]
    rc, out = outs[0]
    assert rc == 7
    assert out == "tty\r\n37 111\r\n"


def _exec_in_pty(t: Target, side: str, rows: int, cols: int, env: Mapping[str, str]) -> tuple[int, str]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    # kubectl sends the terminal's size on the resize channel once the stream is up, while the
    # command may already be running (a real runtime has the same race), so the command waits,
    # up to 10 s, for a size to arrive before it prints it.
    wait = 'i=0; while [ "$(stty size)" = "0 0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done'
    script = f"test -t 0 && echo tty; {wait}; stty size; exit 7"
    argv = [str(t.cp.kubectl), f"--kubeconfig={t.kubeconfig(side)}", "-n", t.ns]
    argv += ["exec", "-it", POD, "-c", "term", "--", "sh", "-c", script]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=subprocess.PIPE, env={**os.environ, **env})
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, f"no output from kubectl exec -t ({side})"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: kubectl exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    _, err = proc.communicate(timeout=30)
    assert err == b"command terminated with exit code 7\n", err
    return proc.returncode, out.decode()


# --------------------------------------------------------------------------- attach


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_attach_stdin(target: Target, transport: str) -> None:
    run = both(
        target, ["attach", "-i", POD, "-c", "main"], input="to the attached process\n", env=TRANSPORTS[transport]
    )
    assert (run.rc, run.out) == (0, "to the attached process\n")


def test_attach_output_and_stderr(target: Target) -> None:
    run = both(target, ["attach", "-i", POD, "-c", "banner"], input="more\n")
    assert (run.rc, run.out) == (0, BANNER + "more\n")
    assert "banner-err\n" in run.err


# --------------------------------------------------------------------------- port-forward

_FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)")


@pytest.mark.parametrize("transport", ["websocket", "spdy"])
def test_port_forward_echo(target: Target, echo_port: int, transport: str) -> None:
    env = {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "true" if transport == "websocket" else "false"}
    payload = os.urandom(1 << 20)
    for side in SIDES:
        assert _forward_and_echo(target, side, echo_port, payload, env) == payload, side


def _forward_and_echo(t: Target, side: str, port: int, payload: bytes, env: Mapping[str, str]) -> bytes:
    (local,) = free_ports(1)
    argv = [str(t.cp.kubectl), f"--kubeconfig={t.kubeconfig(side)}", "-n", t.ns]
    argv += ["port-forward", "--address=127.0.0.1", f"pod/{POD}", f"{local}:{port}"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env}
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        m = _FORWARDING.search(line)
        assert m and m.groups() == (str(local), str(port)), (line, proc.stderr.read() if proc.stderr else "")
        received = bytearray()
        with socket.create_connection(("127.0.0.1", local), timeout=60) as conn:
            sender = threading.Thread(target=conn.sendall, args=(payload,))
            sender.start()
            while len(received) < len(payload):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += chunk
            sender.join()
        return bytes(received)
    finally:
        proc.terminate()
        proc.wait(30)


# --------------------------------------------------------------------------- the Python client

#: The Python client offers v5 and v4 (the apiserver picks v5 and translates it to SPDY);
#: asking for v4 only makes the apiserver proxy the WebSocket itself to the kubelet.
PROTOCOLS = {"v5-and-v4": None, "v4-only": {"sec-websocket-protocol": "v4.channel.k8s.io"}}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_python_stream_exec(target: Target, protocol: str) -> None:
    results = [_python_exec(target.api(side), target.ns, PROTOCOLS[protocol]) for side in SIDES]
    assert results[0] == results[1]
    assert results[0] == ("out\n", "err\n", 5, "typed: hello\n")


def _python_exec(api: client.CoreV1Api, ns: str, headers: dict[str, str] | None) -> tuple[str, str, int | None, str]:
    extra: dict[str, Any] = {"_headers": headers} if headers else {}

    def open_exec(script: str, stdin: bool) -> Any:
        return stream(
            api.connect_get_namespaced_pod_exec,
            POD,
            ns,
            container="main",
            command=["sh", "-c", script],
            stdout=True,
            stderr=True,
            stdin=stdin,
            tty=False,
            _preload_content=False,
            **extra,
        )

    resp = open_exec("echo out; echo err >&2; exit 5", stdin=False)
    resp.run_forever(timeout=30)
    out, err, rc = resp.read_stdout(), resp.read_stderr(), resp.returncode
    resp.close()
    resp = open_exec("read line; echo typed: $line", stdin=True)
    resp.write_stdin("hello\n")
    resp.run_forever(timeout=30)
    typed = resp.read_stdout()
    resp.close()
    api.api_client.close()
    return out, err, rc, typed
