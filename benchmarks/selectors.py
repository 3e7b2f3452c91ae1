"""What the watch cache's selectors cost per object, next to what decoding that object costs, in one run.

    python -m benchmarks.selectors [--objects 5000] [--rounds 5]

The cache extracts each object's selectable fields once when the object arrives (``from_dict`` on the
JSON, ``from_message`` on the decoded protobuf message) and matches selectors against every stored
object on each LIST with a selector. Rows, µs per object (median of the rounds), one core:

* peers: ``orjson.loads`` of the pod's JSON and ``Pod.FromString`` of its protobuf message, the
  decode the cache does anyway for every arriving object;
* ``SelectableFields.from_dict`` / ``from_message`` for pods (10 fields);
* ``LabelSelector.matches`` (``app in (web,db),tier!=cache``) and ``FieldSelector.matches``
  (``spec.nodeName=node-3,status.phase!=Failed``) on the extracted maps;
* ``parse_label_selector`` / ``parse_field_selector`` per request (µs per call, not per object), a
  repeated selector (memo hit) and a new one.

The machine's load average is printed with the table: the host is shared, so compare rows of one
run, not runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from kproxy.cacher.fields import builtin_fields, parse_field_selector
from kproxy.cacher.labels import parse_label_selector
from kproxy.codec.codec import ProtobufCodec
from kproxy.codec.envelope import decode_envelope
from kproxy.codec.schema import load_schema


def pods(n: int) -> list[dict[str, Any]]:
    """Pods shaped like a scheduled workload's (a 3 KB object each)."""
    out = []
    for i in range(n):
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"web-{i:05d}",
                    "namespace": f"ns-{i % 20}",
                    "uid": f"00000000-0000-0000-0000-{i:012d}",
                    "resourceVersion": str(1000 + i),
                    "labels": {"app": ("web", "db", "cache")[i % 3], "tier": "backend", "pod-template-hash": "7d9f"},
                    "annotations": {"example.com/note": "x" * 200},
                },
                "spec": {
                    "nodeName": f"node-{i % 50}",
                    "restartPolicy": "Always",
                    "schedulerName": "default-scheduler",
                    "serviceAccountName": "default",
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example.com/app:1.2.3",
                            "args": ["--port=8080", "--verbose"],
                            "env": [{"name": f"E{k}", "value": "v" * 20} for k in range(10)],
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                        }
                    ],
                },
                "status": {"phase": ("Running", "Pending", "Failed")[i % 3], "podIP": f"10.0.{i // 250}.{i % 250}"},
            }
        )
    return out


def per_item(rounds: int, items: Sequence[Any], fn: Callable[[Any], object]) -> float:
    """Median over rounds of the mean µs per item."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for x in items:
            fn(x)
        times.append((time.perf_counter() - t0) * 1e6 / len(items))
    return statistics.median(times)


def per_call(rounds: int, n: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) * 1e6 / n)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    schema = load_schema()
    codec = ProtobufCodec(schema)
    objs = pods(args.objects)
    raw_json = [orjson.dumps(o) for o in objs]
    pod_cls = schema.message_class(schema.lookup_kind("v1", "Pod") or "")
    raw_proto = [decode_envelope(codec.from_json(o)).raw for o in objs]
    msgs = [pod_cls.FromString(r) for r in raw_proto]
    sf = builtin_fields("", "pods")
    field_maps = [sf.from_dict(o) for o in objs]
    label_maps = [dict(o["metadata"]["labels"]) for o in objs]
    label_text, field_text = "app in (web,db),tier!=cache", "spec.nodeName=node-3,status.phase!=Failed"
    lsel, fsel = parse_label_selector(label_text), parse_field_selector(field_text, sf)
    r = args.rounds
    parse_label = parse_label_selector.__wrapped__  # the parsers without their memo
    parse_field = parse_field_selector.__wrapped__
    rows = [
        ("peer: orjson.loads(pod JSON)", per_item(r, raw_json, orjson.loads), "per object"),
        ("peer: Pod.FromString(protobuf)", per_item(r, raw_proto, pod_cls.FromString), "per object"),
        ("from_dict (pods, 10 fields)", per_item(r, objs, sf.from_dict), "per object"),
        ("from_message (pods, 10 fields)", per_item(r, msgs, sf.from_message), "per object"),
        (f"LabelSelector.matches {label_text!r}", per_item(r, label_maps, lsel.matches), "per object"),
        (f"FieldSelector.matches {field_text!r}", per_item(r, field_maps, fsel.matches), "per object"),
        ("parse_label_selector, memo hit", per_call(r, 2000, lambda: parse_label_selector(label_text)), "per request"),
        (
            "parse_field_selector, memo hit",
            per_call(r, 2000, lambda: parse_field_selector(field_text, sf)),
            "per request",
        ),
        ("parse_label_selector, new text", per_call(r, 2000, lambda: parse_label(label_text)), "per request"),
        ("parse_field_selector, new text", per_call(r, 2000, lambda: parse_field(field_text, sf)), "per request"),
    ]
    print(f"# selectors, {args.objects} pods, median of {r} rounds, load average {os.getloadavg()[0]:.1f}")
    print("| what | µs | |")
    print("|---|---:|---|")
    for name, us, unit in rows:
        print(f"| {name} | {us:.2f} | {unit} |")


if __name__ == "__main__":
    main()
