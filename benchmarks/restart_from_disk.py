"""A restart from the persisted watch cache: from ``kproxy run``'s exec to its first cached LIST.

    python -m benchmarks.restart_from_disk [--objects 50000] [--rounds 3] [--output FILE]

The state on disk is made by kproxy's own code (``kproxy.cacher.persist``, as a running cache
writes it) for ``--objects`` ConfigMaps of about 500 bytes, twice: as a cache whose readers had
only protobuf (the objects' bytes alone) and as one whose readers had every object's JSON made
(kept beside them). Each round restarts ``kproxy run`` (the watch cache of configmaps, persisted;
``credentials: proxy``; plain HTTP) on a copy of each state, with an upstream that refuses every
connection, so that what is measured is kproxy alone: the interpreter and imports, loading the
state, listening, and a ``resourceVersion=0`` LIST of every ConfigMap answered from the cache,
asked in protobuf and in JSON, read to its end. The time runs from exec to the last byte of that
answer (the client asks every 5 ms from exec); ``loaded`` is kproxy's own log of the load.
kproxy's modules are compiled to bytecode first, as the container image (its Dockerfile) and a
``pip install`` have them: a checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise
compile every module from source at each start (about 0.2 s here), which no deployment does.

Goal (a node-local restart): the first cached LIST within 1 s of exec with 50,000 objects.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson

import kproxy
from benchmarks.lib.common import child_env, log, machine_line, work_dir
from benchmarks.lib.report import met
from kproxy.cacher import Kind, WatchCache
from kproxy.cacher.fields import builtin_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.cacher.persist import ResourceStore, prepare_dir
from kproxy.codec import ProtobufCodec, decode_envelope
from kproxy.localcluster.processes import free_ports
from kproxy.testing.unreachable import unreachable_config

CONFIGMAP = Kind("v1", "ConfigMap", "ConfigMapList", protobuf=True)
IDENT = "core+v1+configmaps"
PROTOBUF = "application/vnd.kubernetes.protobuf"
JSON = "application/json"
GOAL_SECONDS = 1.0
_LOADED = re.compile(rb"loaded from disk in ([0-9.]+) s")


def _identity(upstream: str) -> tuple[dict[str, object], dict[str, object]]:
    """The identity and description a running kproxy gives its configmaps' state (the upstream
    here has no CA of its own: its URL alone names it)."""
    identity: dict[str, object] = {"upstream": upstream, "group": "", "version": "v1", "resource": "configmaps"}
    identity |= {"kind": "ConfigMap", "protobuf": True, "encrypted": False}
    about: dict[str, object] = {"group": "", "version": "v1", "resource": "configmaps", "namespaced": True}
    about |= {"crd_paths": None, "api_version": "v1", "kind": "ConfigMap", "list_kind": "ConfigMapList"}
    about["protobuf"] = True
    return identity, about


def write_state(directory: Path, upstream: str, n: int, with_json: bool) -> int:
    """The persisted state of ``n`` ConfigMaps; its size in bytes."""
    codec = ProtobufCodec()
    factory = ObjectFactory(CONFIGMAP, builtin_fields("", "configmaps"), codec)
    objects = []
    for i in range(n):
        meta: dict[str, object] = {"name": f"cm-{i:06d}", "namespace": f"ns-{i % 50}"}
        meta["resourceVersion"] = str(1000 + i)
        meta |= {"uid": f"00000000-0000-4000-8000-{i:012d}", "labels": {"app": f"a{i % 10}"}}
        meta["creationTimestamp"] = "2026-11-29T00:00:00Z"
        obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v" * 400}}
        cached = factory.from_proto(decode_envelope(codec.from_json(orjson.dumps(obj))).raw)
        if with_json:
            assert cached.item_json  # a JSON reader had it made
        objects.append(cached)
    identity, about = _identity(upstream)

    async def persist() -> None:
        prepare_dir(str(directory))
        cache = WatchCache(CONFIGMAP)
        store = ResourceStore(directory, IDENT, identity, None, spec=about)
        store.attach(cache, None)
        cache.replace(objects, 1000 + n)
        await asyncio.sleep(0)
        if store._compacting is not None:
            await store._compacting
        await store.close()

    asyncio.run(persist())
    return sum(p.stat().st_size for p in directory.iterdir())


def restart(work: Path, state: Path, upstream_port: int, accept: str) -> tuple[float, float]:
    """(seconds from exec to the whole first cached LIST, seconds kproxy says the load took)."""
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    copy = run / "state"
    shutil.copytree(state, copy)
    (copy / ".lock").unlink(missing_ok=True)
    os.chmod(copy, 0o700)
    filters = [{"name": "watchcache", "resources": ["configmaps"], "persist": {"dir": str(copy)}}]
    config, port = unreachable_config(run, filters, upstream_port=upstream_port, log_level="info")
    url = f"http://127.0.0.1:{port}/api/v1/configmaps?resourceVersion=0"
    with open(run / "kproxy.log", "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "kproxy.cli", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=child_env(),
            cwd="/",
        )
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"kproxy exited with {proc.returncode}: {(run / 'kproxy.log').read_text()[-2000:]}"
                    )
                if time.monotonic() - started > 120:
                    raise RuntimeError("no cached answer within 120 s")
                try:
                    with urllib.request.urlopen(
                        urllib.request.Request(url, headers={"Accept": accept}), timeout=30
                    ) as r:
                        r.read()
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass  # not listening yet, or the 429 of an unready cache (the upstream is unreachable)
                time.sleep(0.005)
            elapsed = time.monotonic() - started
        finally:
            proc.terminate()
            proc.wait(60)
    found = _LOADED.search((run / "kproxy.log").read_bytes())
    if found is None:
        raise RuntimeError("kproxy did not load the state (see its log)")
    return elapsed, float(found.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=Path)
    args = ap.parse_args()
    # As the image and pip install have them (the docstring says why).
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(kproxy.__file__).parent)], check=True)
    load_before = os.getloadavg()
    (closed,) = free_ports(1)  # nothing listens there: the upstream refuses every connection
    with work_dir("kproxy-bench-restart-") as work:
        states = {}
        for with_json in (False, True):
            name = "bytes and readers' JSON" if with_json else "bytes only"
            state = work / ("json" if with_json else "bytes")
            size = write_state(state, f"https://127.0.0.1:{closed}", args.objects, with_json)
            log(f"state ({name}): {size / 2**20:.1f} MiB")
            states[name] = (state, size)
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            for name, (state, _) in states.items():
                for accept in (PROTOBUF, JSON):
                    results.setdefault((name, accept), []).append(restart(work, state, closed, accept))
            log(f"round {r + 1} of {args.rounds} done")
    lines = [
        f"# Restart from the persisted watch cache ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        machine_line(load_before),
        f"- {args.objects:,} ConfigMaps of about 500 bytes; {args.rounds} rounds; medians, each run in brackets;"
        " kproxy's bytecode compiled first, as in the container image",
        "",
        "| state on disk | size | first LIST asked in | exec to the whole first cached LIST "
        "| loaded (kproxy's log) | goal 1 s |",
        "|---|--:|---|--:|--:|---|",
    ]
    for (name, accept), runs in results.items():
        total = statistics.median(t for t, _ in runs)
        loaded = statistics.median(s for _, s in runs)
        each = ", ".join(f"{t:.2f}" for t, _ in runs)
        mib = states[name][1] / 2**20
        media = "protobuf" if accept == PROTOBUF else "JSON"
        goal = met(total <= GOAL_SECONDS)
        lines.append(f"| {name} | {mib:.1f} MiB | {media} | {total:.2f} s ({each}) | {loaded:.2f} s | {goal} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output is not None:
        args.output.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
