"""One side of the fairness measurement, in its own process: an attacker or a victim.

    python -m benchmarks.lib.fairness_load attacker --url URL --ca CA --token T --namespace NS \\
        [--connections 8] [--duration 10] [--size 3000000]
    python -m benchmarks.lib.fairness_load victim --url URL --ca CA --token T --namespace NS \\
        [--duration 10] [--size 20480] [--ready FILE]

The attacker loops on ``--connections`` connections, each sending a YAML ConfigMap of ``--size``
bytes with a field no schema has (``?fieldValidation=Strict``: refused with a 400, by kproxy
itself when a Strict rule covers the namespace). The victim creates ConfigMaps of ``--size`` bytes
(JSON, valid) one after another and records each create's latency. Both print one JSON line on
stdout: the statuses seen, connection errors, and (victim) the latencies in seconds. The attacker
makes the file ``--ready`` once its first answer came; the victim starts once it exists, so that it
is measured under the attack. The token comes from ``--token`` or ``$FAIRNESS_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import ssl
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

STRICT = "?fieldValidation=Strict"


def attack_body(size: int) -> bytes:
    """A YAML ConfigMap of about ``size`` bytes (many small keys: YAML's costly case) with an
    unknown top-level field."""
    head = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  generateName: attack-\nbogus: 1\ndata:\n"
    line = b"  k%07d: vvvvvvvvvvvvvvvv\n"
    lines = [line % i for i in range(max(0, (size - len(head)) // len(line % 0)))]
    return head + b"".join(lines)


def victim_body(size: int, name: str) -> bytes:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"blob": ""}}
    pad = size - len(json.dumps(obj))
    obj["data"] = {"blob": "x" * max(0, pad)}
    return json.dumps(obj).encode()


def _headers(token: str, ctype: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": ctype, "Accept": "application/json"}


def _session(ca: str | None, connections: int) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=ca) if ca else None
    connector = aiohttp.TCPConnector(limit=connections, ssl=ctx if ctx is not None else False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))


async def attacker(args: argparse.Namespace) -> dict[str, Any]:
    body = attack_body(args.size)
    url = f"{args.url}/api/v1/namespaces/{args.namespace}/configmaps{STRICT}"
    headers = {
        "Authorization": f"Bearer {args.token}",
        "Content-Type": "application/yaml",
        "Accept": "application/json",
    }
    statuses: Counter[int] = Counter()
    errors = 0
    retry_after: Counter[str] = Counter()
    end = time.monotonic() + args.duration

    async def loop(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < end:
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
                    if args.ready and not os.path.exists(args.ready):
                        Path(args.ready).touch()  # the attack is under way: the victim may start
                    if resp.status == 429:
                        retry_after[resp.headers.get("Retry-After", "")] += 1
            except (TimeoutError, aiohttp.ClientError, OSError):
                errors += 1
                await asyncio.sleep(0.05)

    async with _session(args.ca, args.connections) as session:
        await asyncio.gather(*(loop(session) for _ in range(args.connections)))
    return {"statuses": dict(statuses), "errors": errors, "retry_after": dict(retry_after)}


async def victim(args: argparse.Namespace) -> dict[str, Any]:
    url = f"{args.url}/api/v1/namespaces/{args.namespace}/configmaps{STRICT}"
    headers = {
        "Authorization": f"Bearer {args.token}",
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    if args.ready:
        while not Path(args.ready).exists():
            await asyncio.sleep(0.02)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    errors = 0
    names: list[str] = []
    kinds: Counter[str] = Counter()
    failed: list[tuple[str, float]] = []  # each failed create: the error, and after how long
    end = time.monotonic() + args.duration
    async with _session(args.ca, 1) as session:
        while time.monotonic() < end:
            name = f"{args.prefix}-{secrets.token_hex(4)}"
            data = victim_body(args.size, name)
            t0 = time.perf_counter()
            try:
                async with session.post(url, data=data, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                errors += 1
                kinds[type(err).__name__] += 1
                failed.append((type(err).__name__, round(time.perf_counter() - t0, 3)))
                continue
            latencies.append(time.perf_counter() - t0)
            if resp.status == 201:
                names.append(name)
            await asyncio.sleep(args.interval)
    return {
        "statuses": dict(statuses),
        "errors": errors,
        "kinds": dict(kinds),
        "failed": failed,
        "latencies": latencies,
        "names": names,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lib.fairness_load")
    p.add_argument("role", choices=("attacker", "victim"))
    p.add_argument("--url", required=True)
    p.add_argument("--ca", default=None)
    p.add_argument("--token", default=os.environ.get("FAIRNESS_TOKEN", ""))
    p.add_argument("--namespace", required=True)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--size", type=int, default=0)
    p.add_argument("--prefix", default="victim")
    p.add_argument("--interval", type=float, default=0.05, help="pause between victim creates (s)")
    p.add_argument("--ready", default="", help="attacker: made after its first answer; victim: starts once it exists")
    args = p.parse_args(argv)
    if args.role == "attacker":
        args.size = args.size or 3_000_000
        out = asyncio.run(attacker(args))
    else:
        args.size = args.size or 20 * 1024
        out = asyncio.run(victim(args))
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
