"""The watch cache on disk: a kproxy restarted on its persisted state vs one starting empty.

    python -m benchmarks.watchcache_persist [--objects 50000] [--envtest-dir DIR] [--output FILE]

One kproxy (``credentials: proxy``, plain HTTP, the ``watchcache`` filter caching ``configmaps``
with ``persist``) in front of the control plane, reaching the apiserver through a TCP relay in
this process that counts the bytes the apiserver sends kproxy (TLS records: what crosses the
link). ``--objects`` ConfigMaps of ~500 bytes are created in namespace ``bench-persist``.

Runs, each from kproxy's exec:

* ``cold``: an empty persist directory: kproxy lists every ConfigMap (a streaming list);
* ``restart``: the same directory after a SIGTERM: kproxy loads the snapshot and resumes its
  watch from the persisted resource version;
* ``restart after changes``: 1% of the objects changed while kproxy was down.

For each: the time from exec to the first ``resourceVersion=0`` LIST kproxy serves from its cache
(polled every 20 ms with ``limit=1``; kproxy's metrics must count it as served by the cache),
the time to kproxy listening (Python's start, before any cache can answer), and the bytes the
apiserver sent kproxy from exec until the cache holds the apiserver's state and 3 s passed
(discovery, the list or the watch's catch-up, its probes).

Goals (the node-local restart): the first cached LIST within 1 s of exec; the apiserver sends a
restart less than 5% of the bytes of the cold start's list. Exit status 0 when met, 1 when not,
2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.lib.common import BenchError, log, ncpu
from kproxy.localcluster import envtest
from kproxy.localcluster.binaries import k8s_version
from kproxy.localcluster.processes import free_ports

NAMESPACE = "bench-persist"
LIST_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
GOAL_FIRST_LIST = 1.0
GOAL_BYTES_RATIO = 0.05
SETTLE = 3.0


class Relay:
    """A TCP relay to the apiserver counting the bytes each way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.down = 0  # apiserver -> kproxy
        self.up = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, downstream: bool) -> None:
            try:
                while data := await r.read(1 << 16):
                    if downstream:
                        self.down += len(data)
                    else:
                        self.up += len(data)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    w.close()

        await asyncio.gather(pipe(reader, uw, False), pipe(ur, writer, True))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass
class Run:
    name: str
    listening: float = 0.0
    first_cached_list: float = 0.0
    converged: float = 0.0
    bytes_down: int = 0
    loaded: bool = False
    relists: float = 0.0
    load_seconds: float = 0.0


def _kubeconfig_via(cp: envtest.ControlPlaneInfo, port: int, path: Path) -> Path:
    kc = yaml.safe_load(cp.admin_kubeconfig.read_text())
    for c in kc["clusters"]:
        c["cluster"]["server"] = re.sub(r":\d+$", f":{port}", c["cluster"]["server"])
    path.write_text(yaml.safe_dump(kc))
    return path


def _cm(i: int, rnd: random.Random, gen: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"cm-{i:06d}", "labels": {"app": f"app-{i % 50}", "tier": "bench"}},
        "data": {"config.yaml": f"gen: {gen}\n" + "".join(rnd.choice("abcdefghij") for _ in range(400))},
    }


async def _create(session: aiohttp.ClientSession, base: str, count: int, concurrency: int = 48) -> None:
    rnd = random.Random(5)
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        async with sem, session.post(base + LIST_PATH, json=_cm(i, rnd)) as r:
            if r.status not in (201, 409):
                raise BenchError(f"creating configmap: {r.status} {await r.text()}")
        done += 1
        if done % 5000 == 0:
            log(f"  {done} created")

    await asyncio.gather(*(one(i) for i in range(count)))


async def _change(session: aiohttp.ClientSession, base: str, count: int, step: int) -> None:
    rnd = random.Random(9)
    for i in range(0, count, step):
        async with session.put(f"{base}{LIST_PATH}/cm-{i:06d}", json=_cm(i, rnd, gen=1)) as r:
            if r.status != 200:
                raise BenchError(f"changing configmap: {r.status} {await r.text()}")


def _metric(text: str, pattern: str) -> float:
    m = re.search(pattern + r" ([0-9.e+]+)", text)
    return float(m.group(1)) if m else 0.0


async def _kproxy_run(
    name: str, work: Path, kubeconfig: Path, state: Path, relay: Relay, direct: aiohttp.ClientSession, base: str
) -> tuple[Run, subprocess.Popen[bytes]]:
    port, admin = free_ports(2)
    cfg = {
        "listen": f"127.0.0.1:{port}",
        "admin_listen": f"127.0.0.1:{admin}",
        "credentials": "proxy",
        "upstream": {"kubeconfig": str(kubeconfig)},
        "log": {"level": "info", "format": "json", "access_log": False},
        "proxy": {"accept_hosts": ["^127\\.0\\.0\\.1$"]},
        "filters": [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(state)}}],
    }
    cfg_path = work / f"{name.replace(' ', '-')}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    run = Run(name)
    url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    start_bytes = relay.down
    logf = (work / f"{name.replace(' ', '-')}.log").open("wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg_path)], stdout=logf, stderr=subprocess.STDOUT
    )
    served = r'kproxy_watchcache_reads_total\{reason="any",resource="configmaps",served="cache",verb="list"\}'
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        deadline = t0 + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BenchError(f"kproxy exited: {(work / f'{name}.log').read_text()[-2000:]}")
            try:
                async with s.get(f"{url}{LIST_PATH}?resourceVersion=0&limit=1") as r:
                    await r.read()
                    if not run.listening:
                        run.listening = time.monotonic() - t0
                    if r.status == 200:
                        async with s.get(f"{admin_url}/metrics") as m:
                            if _metric(await m.text(), served) >= 1:
                                run.first_cached_list = time.monotonic() - t0
                                break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.02)
        else:
            raise BenchError(f"{name}: no cached LIST in 600 s")
        # Converged: the cache's LIST equals the apiserver's (names and resource versions).
        async with direct.get(base + LIST_PATH) as r:
            want = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in (await r.json())["items"]}
        while time.monotonic() < deadline:
            async with s.get(f"{url}{LIST_PATH}?resourceVersion=0") as r:
                got = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in (await r.json())["items"]}
            if got == want:
                run.converged = time.monotonic() - t0
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(SETTLE)
        run.bytes_down = relay.down - start_bytes
        async with s.get(f"{admin_url}/metrics") as m:
            text = await m.text()
        run.loaded = (
            _metric(text, r'kproxy_watchcache_persist_loads_total\{outcome="loaded",resource="configmaps"\}') >= 1
        )
        run.relists = _metric(text, r'kproxy_watchcache_relists_total\{reason="[a-z]+",resource="configmaps"\}')
    logf.close()
    found = re.search(r"loaded from disk in ([0-9.]+) s", (work / f"{name.replace(' ', '-')}.log").read_text())
    run.load_seconds = float(found.group(1)) if found else 0.0
    return run, proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def amain(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, work: Path) -> tuple[str, bool]:
    relay = Relay(cp.apiserver_port)
    await relay.start()
    kubeconfig = _kubeconfig_via(cp, relay.port, work / "relay.kubeconfig")
    state = work / "state"
    ssl_ctx = cp.ssl_context()
    base = cp.server
    runs: list[Run] = []
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=64), timeout=aiohttp.ClientTimeout(total=600)
    ) as direct:
        async with direct.post(base + "/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}) as r:
            if r.status not in (201, 409):
                raise BenchError(f"namespace: {r.status}")
        async with direct.get(f"{base}{LIST_PATH}?limit=1") as r:
            have = int((await r.json())["metadata"].get("remainingItemCount", 0)) + 1
        if have < args.objects:
            log(f"creating {args.objects} configmaps ...")
            t = time.monotonic()
            await _create(direct, base, args.objects)
            log(f"  created in {time.monotonic() - t:.0f} s")
        for name, before in (("cold", None), ("restart", None), ("restart after changes", "change")):
            if name == "cold":
                shutil.rmtree(state, ignore_errors=True)
            if before == "change":
                await _change(direct, base, args.objects, 100)
            log(f"{name} ...")
            run, proc = await _kproxy_run(name, work, kubeconfig, state, relay, direct, base)
            _stop(proc)
            runs.append(run)
            log(f"  {run}")
    await relay.close()
    disk = sum(p.stat().st_size for p in state.iterdir() if p.is_file())
    cold = runs[0]
    lines = [
        "# The watch cache on disk: restart vs cold start",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}, {ncpu()} CPUs (shared); "
        f"Python {platform.python_version()}; kube-apiserver {k8s_version()}; "
        f"{args.objects} ConfigMaps of ~500 bytes; persisted state {disk / 2**20:.1f} MiB on disk.",
        "",
        "Times from kproxy's exec (listening: its first answer of any kind; a persisted state is loaded before it "
        "listens, in the time shown under loaded from disk); converged: a full JSON LIST through kproxy equals the "
        "apiserver's (that check encodes every object's JSON once). Bytes the apiserver sent kproxy (TLS, "
        "through a counting relay) from exec "
        f"until the cache equals the apiserver's state plus {SETTLE:.0f} s.",
        "",
        "| run | listening | first cached LIST | converged | apiserver bytes | vs cold | loaded from disk | relists |",
        "|---|--:|--:|--:|--:|--:|---|--:|",
    ]
    for one in runs:
        lines.append(
            f"| {one.name} | {one.listening:.2f} s | {one.first_cached_list:.2f} s | {one.converged:.2f} s | "
            f"{one.bytes_down / 2**20:.2f} MiB | {one.bytes_down / cold.bytes_down:.1%} | "
            f"{f'yes, in {one.load_seconds:.2f} s' if one.loaded else 'no'} "
            f"| {one.relists:.0f} |"
        )
    restart = runs[1]
    ok = (
        restart.loaded
        and restart.first_cached_list < GOAL_FIRST_LIST
        and restart.bytes_down / cold.bytes_down < GOAL_BYTES_RATIO
    )
    lines += [
        "",
        f"Goals (restart): first cached LIST < {GOAL_FIRST_LIST:.0f} s: "
        f"{'met' if restart.first_cached_list < GOAL_FIRST_LIST else 'NOT met'} ({restart.first_cached_list:.2f} s); "
        f"apiserver bytes < {GOAL_BYTES_RATIO:.0%} of a relist: "
        f"{'met' if restart.bytes_down / cold.bytes_down < GOAL_BYTES_RATIO else 'NOT met'} "
        f"({restart.bytes_down / cold.bytes_down:.2%}).",
        "",
    ]
    return "\n".join(lines), ok


@contextlib.contextmanager
def control_plane(reuse: Path | None) -> Iterator[envtest.ControlPlaneInfo]:
    if reuse is not None:
        yield envtest.load(reuse)
        return
    directory = Path(tempfile.mkdtemp(prefix="kproxy-bench-persist-cp-"))
    try:
        log(f"starting a control plane in {directory} ...")
        yield envtest.up(directory)
    finally:
        envtest.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.watchcache_persist", description=__doc__.split("\n")[0])
    p.add_argument("--objects", type=int, default=50000)
    p.add_argument("--envtest-dir", type=Path, default=os.environ.get(envtest.DIR_ENV) or None)
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kproxy-bench-persist-"))
    try:
        with control_plane(args.envtest_dir) as cp:
            text, ok = asyncio.run(amain(args, cp, work))
    except (BenchError, envtest.EnvtestError) as e:
        log(f"error: {e}")
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
