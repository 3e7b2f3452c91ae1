"""The Kubernetes protobuf codec (kproxy.codec) measured on a real apiserver's list, in one run.

    python -m benchmarks.codec [--envtest-dir DIR] [--pods 5000] [--repeat 5] [--output FILE]

The body is the kube-apiserver's own answer: ``--pods`` realistic pods (benchmarks.compression's
generator: two containers, env, resources, probes, managedFields; ~3 KB of JSON each) listed in
protobuf and in JSON from the local control plane (started here unless ``--envtest-dir`` names
a running one). Every figure is CPU time of this one process (one core), the median of
``--repeat`` runs (and the best run, the least disturbed on a shared machine), with the garbage
collector on, as in kproxy.

Rows, each against the apiserver's JSON for the same list (equality checked first):

* kproxy.codec to_json (whole body), the list transcoder fed 64 KiB chunks and the watch
  transcoder (one pod per frame): MB/s of JSON out, each also with the wire reader off (the upb
  path it falls back to: a upb message per object, every declared field read), measured in
  turns with it; to_json again with its sub-object memo off (every container, probe,
  toleration... encoded afresh instead of reused when its protobuf bytes repeat, as they do
  across replicas);
* the peer: protobuf's own generic converter (json_format.MessageToDict + orjson) on the same
  message, which is not Kubernetes JSON (int64 as strings, no omitempty rules) but the same walk
  done by the library;
* the floor: upb parsing alone, and orjson loads+dumps of the JSON body;
* JSON -> protobuf (from_json) and encode_watch_event (JSON event -> frame).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from google.protobuf import json_format

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import log
from benchmarks.lib.data import NAMESPACE, seed_pods
from benchmarks.lib.procs import self_cpu_seconds
from kproxy.codec import ProtobufCodec, decode_envelope
from kproxy.localcluster import envtest


async def fetch_list(info: envtest.ControlPlaneInfo) -> tuple[bytes, bytes]:
    """(protobuf, JSON) bodies of the namespace's pod list, as the apiserver sends them."""
    ssl_ctx = info.ssl_context()
    async with aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl_ctx)) as s:

        async def get(accept: str) -> bytes:
            async with s.get(f"/api/v1/namespaces/{NAMESPACE}/pods", headers={"Accept": accept}) as r:
                r.raise_for_status()
                return await r.read()

        # A consistent pair: the protobuf list unchanged around the JSON one (pods still settling
        # right after seeding would make the two answers differ).
        for _ in range(10):
            pb = await get("application/vnd.kubernetes.protobuf")
            js = await get("application/json")
            if await get("application/vnd.kubernetes.protobuf") == pb:
                break
            await asyncio.sleep(1)
    return pb, js


Timing = tuple[float, float]  # (median, best) CPU seconds


def cpu(fn: Callable[[], Any], repeat: int) -> Timing:
    """Median and best CPU seconds of fn() over `repeat` runs (after one warm-up)."""
    return cpu_rounds({"": fn}, repeat)[""]


def cpu_rounds(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, Timing]:
    """Median and best CPU seconds of each fn over `repeat` rounds in which they take turns
    (after one warm-up each): what is compared is measured under the same load (the machine is
    shared; the best run is the one least disturbed by other work)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t = self_cpu_seconds()
            fn()
            samples[name].append(self_cpu_seconds() - t)
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def run(pb: bytes, js: bytes, repeat: int) -> str:
    codec = ProtobufCodec()
    upb = ProtobufCodec(codec.schema, wire=False)
    expected = json.loads(js)
    env = decode_envelope(pb)
    full = codec.schema.lookup_kind(env.api_version, env.kind)
    assert full is not None
    cls = codec.schema.message_class(full)
    n_items = len(expected["items"])
    out = codec.to_json(pb)
    out_len = len(out)
    assert out + b"\n" == js, "to_json differs from the apiserver's JSON (byte for byte)"
    assert upb.to_json(pb) == out, "the upb path differs from the wire reader"

    def transcode_chunks(c: ProtobufCodec) -> Callable[[], bytes]:
        def go() -> bytes:
            t = c.list_transcoder()
            parts = [t.feed(pb[i : i + 65536]) for i in range(0, len(pb), 65536)]
            parts.append(t.finish())
            return b"".join(parts)

        return go

    assert transcode_chunks(codec)() == out, "list transcoder differs from the apiserver's JSON"
    assert transcode_chunks(upb)() == out, "list transcoder (upb path) differs from the apiserver's JSON"

    def peer() -> bytes:
        return orjson.dumps(json_format.MessageToDict(cls.FromString(env.raw)))

    # Watch: one frame per pod, as a watch on the namespace would carry them.
    events: list[dict[str, Any]] = [
        {"type": "ADDED", "object": {"kind": "Pod", "apiVersion": "v1", **item}} for item in expected["items"]
    ]
    frames = b"".join(codec.encode_watch_event(e["type"], e["object"]) for e in events)
    watch_json_len = sum(len(orjson.dumps(e)) + 1 for e in events)

    def watch(c: ProtobufCodec) -> Callable[[], bytes]:
        def go() -> bytes:
            t = c.watch_transcoder()
            return t.feed(frames) + t.finish()

        return go

    got = [json.loads(line) for line in watch(codec)().splitlines()]
    assert got == events, "watch transcoder differs"
    assert watch(upb)() == watch(codec)(), "watch transcoder (upb path) differs"

    cold = ProtobufCodec(codec.schema, memo_size=0)
    fallbacks = codec.wire_fallbacks
    paired = cpu_rounds(
        {
            "to_json": lambda: codec.to_json(pb),
            "to_json upb": lambda: upb.to_json(pb),
            "to_json cold": lambda: cold.to_json(pb),
            "list": transcode_chunks(codec),
            "list upb": transcode_chunks(upb),
            "watch": watch(codec),
            "watch upb": watch(upb),
        },
        repeat,
    )
    assert codec.wire_fallbacks == fallbacks, "the wire reader left objects of the benchmark to upb"
    rows: list[tuple[str, Timing, int, str]] = [
        ("kproxy.codec to_json (whole list)", paired["to_json"], out_len, "JSON out"),
        ("same, upb path (wire reader off)", paired["to_json upb"], out_len, "JSON out"),
        ("same, sub-object memo off", paired["to_json cold"], out_len, "JSON out"),
        ("kproxy.codec list transcoder, 64 KiB chunks", paired["list"], out_len, "JSON out"),
        ("same, upb path (wire reader off)", paired["list upb"], out_len, "JSON out"),
        ("kproxy.codec watch transcoder (1 pod/frame)", paired["watch"], watch_json_len, "JSON out"),
        ("same, upb path (wire reader off)", paired["watch upb"], watch_json_len, "JSON out"),
        ("kproxy.codec to_obj (Python objects)", cpu(lambda: codec.to_obj(pb), repeat), out_len, "JSON equiv."),
        ("peer: protobuf json_format.MessageToDict + orjson", cpu(peer, repeat), out_len, "JSON equiv."),
        ("floor: upb parse only", cpu(lambda: cls.FromString(env.raw), repeat), len(pb), "protobuf in"),
        (
            "floor: orjson loads + dumps of the JSON",
            cpu(lambda: orjson.dumps(orjson.loads(js)), repeat),
            len(js),
            "JSON in",
        ),
        ("kproxy.codec from_json (JSON -> protobuf)", cpu(lambda: codec.from_json(js), repeat), len(js), "JSON in"),
        (
            "kproxy.codec encode_watch_event (JSON -> frame)",
            cpu(lambda: [codec.encode_watch_event(e["type"], e["object"]) for e in events], repeat),
            watch_json_len,
            "JSON in",
        ),
    ]
    lines = [
        f"# kproxy.codec, {n_items} pods: protobuf {len(pb) / 1e6:.2f} MB, JSON {len(js) / 1e6:.2f} MB "
        f"(apiserver), kproxy JSON {out_len / 1e6:.2f} MB",
        "",
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, gc on, "
        f"one core, median of {repeat}; the first seven rows take turns in each round (same load)",
        "",
        "| operation | CPU s | MB/s | best run MB/s | per item (µs) | of |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, (secs, best), size, unit in rows:
        lines.append(
            f"| {name} | {secs:.3f} | {size / secs / 1e6:.1f} | {size / best / 1e6:.1f} "
            f"| {secs / n_items * 1e6:.1f} | {unit} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envtest-dir", type=Path, default=None)
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args(argv)
    with control_plane(args.envtest_dir) as info:
        asyncio.run(seed_pods(info, args.pods))
        pb, js = asyncio.run(fetch_list(info))
    log(f"list: {len(pb)} bytes protobuf, {len(js)} bytes JSON")
    gc.collect()
    table = run(pb, js, args.repeat)
    sys.stdout.write(table)
    if args.output:
        args.output.write_text(table)


if __name__ == "__main__":
    main()
