"""kproxy vs kubectl proxy vs the kube-apiserver itself, in one run on the local control plane.

    python -m benchmarks.proxies [--duration 10] [--rounds 1] [--envtest-dir DIR] [--output FILE]

Three peers answer the same requests:

* ``direct``: the kube-apiserver, HTTPS with the admin client certificate;
* ``kproxy``: ``kproxy run`` with an empty filter chain, ``credentials: proxy``, plain HTTP;
* ``kubectl proxy``: the kubectl built with the control plane, plain HTTP, filter disabled.

Scenarios: a small GET (one ConfigMap), a LIST of 500 ConfigMaps (JSON, no compression) and
the same LIST with ``Accept-Encoding: gzip``.  Each (scenario, peer) measurement runs the
closed-loop load generator of :mod:`benchmarks.lib.load` in its own process.  With ``--rounds N``
every scenario is measured N times per peer, the peer order rotating between rounds, and the
samples are pooled.

The control plane is started in a temporary directory and stopped at the end unless
``--envtest-dir`` names one started with ``kproxy envtest up``; the proxies are always started
here and always stopped (also on errors, Ctrl-C and SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.lib.cluster import DIRECT, KPROXY, KUBECTL, Peer, control_plane, start_kproxy, start_kubectl_proxy
from benchmarks.lib.common import BenchError, k8s_server_version, log, machine_line, ncpu, software_line, work_dir
from benchmarks.lib.data import CONFIGMAP_NAMESPACE as NAMESPACE
from benchmarks.lib.data import CONFIGMAPS, DATA_BYTES, GET_NAME, seed_configmaps
from benchmarks.lib.load import MACHINE, Expect, LoadResult, LoadSpec, TLSFiles, run_in_process
from benchmarks.lib.report import num, per_round, ratio
from benchmarks.lib.stats import percentile
from kproxy.localcluster import envtest

PEER_CHOICES = {"direct": DIRECT, "kproxy": KPROXY, "kubectl-proxy": KUBECTL}

#: share of the machine other processes may use during a measurement before the report warns
NOISY_OTHERS = 0.10


# --------------------------------------------------------------------------- peers and scenarios


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    concurrency: int
    headers: dict[str, str]
    expect: Expect


def scenarios(concurrency_get: int, concurrency_list: int, gzip: bool) -> list[Scenario]:
    base = {"Accept": "application/json", "User-Agent": "kproxy-bench"}
    # Say "identity" explicitly: a request without Accept-Encoding lets Go's transport in kubectl
    # proxy ask the apiserver for gzip and decompress it itself, which no other peer would do.
    plain = {**base, "Accept-Encoding": "identity"}
    ns = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    out = [
        Scenario("GET 1 ConfigMap", f"{ns}/{GET_NAME}", concurrency_get, plain, Expect("ConfigMap")),
        Scenario(f"LIST {CONFIGMAPS}", ns, concurrency_list, plain, Expect("ConfigMapList", CONFIGMAPS)),
    ]
    if gzip:
        out.append(
            Scenario(
                f"LIST {CONFIGMAPS} gzip",
                ns,
                concurrency_list,
                {**base, "Accept-Encoding": "gzip"},
                Expect("ConfigMapList", CONFIGMAPS),
            )
        )
    return out


# --------------------------------------------------------------------------- measurements


@dataclass
class Measurement:
    """One (scenario, peer) pair, pooled over rounds."""

    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    check_errors: list[str] = field(default_factory=list)
    body_bytes: int = 0
    window_s: float = 0.0
    cpu_s: Counter[str] = field(default_factory=Counter)
    encodings: set[str] = field(default_factory=set)
    #: requests/s of each round, in order (peers of one round ran minutes apart at most)
    round_rps: list[float] = field(default_factory=list)

    def add(self, r: LoadResult) -> None:
        if r.check_error:
            self.check_errors.append(r.check_error)
            return
        self.latencies_ms += r.latencies_ms
        self.ok += r.ok
        self.errors.update(r.errors)
        self.body_bytes += r.body_bytes
        self.window_s += r.window_s
        self.cpu_s.update(r.cpu_s)
        self.encodings.add(r.content_encoding)
        self.round_rps.append(r.ok / r.window_s if r.window_s else 0.0)

    @property
    def failed(self) -> bool:
        return bool(self.check_errors) or self.ok == 0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)

    @property
    def rps(self) -> float:
        return self.ok / self.window_s if self.window_s else 0.0

    @property
    def kib_per_response(self) -> float:
        return self.body_bytes / self.ok / 1024 if self.ok else float("nan")

    def cpu_ms_per_request(self, name: str) -> float | None:
        if name not in self.cpu_s or not self.ok:
            return None
        return self.cpu_s[name] * 1000 / self.ok

    def cpu_busy(self, ncpu: int) -> tuple[float, float]:
        """Fractions of the machine's CPUs used during the windows: by the benchmark's own
        processes (load generator, proxy, apiserver, etcd), and by everything else."""
        if not self.window_s:
            return float("nan"), float("nan")
        capacity = self.window_s * ncpu
        ours = sum(v for k, v in self.cpu_s.items() if k != MACHINE)
        machine = self.cpu_s.get(MACHINE)
        others = max(0.0, machine - ours) / capacity if machine is not None else float("nan")
        return ours / capacity, others


def context_lines(args: argparse.Namespace, k8s: str, load_before: tuple[float, float, float]) -> list[str]:
    return [
        machine_line(load_before),
        software_line(k8s),
        f"- load: closed loop, keep-alive, one load-generator process per measurement; "
        f"GET concurrency {args.concurrency_get}, LIST concurrency {args.concurrency_list}; "
        f"{args.duration:g} s measured after {args.warmup:g} s warm-up, {args.rounds} round(s)",
        f"- data: {CONFIGMAPS} ConfigMaps of ~{DATA_BYTES} B in namespace {NAMESPACE}; "
        f"GET /api/v1/namespaces/{NAMESPACE}/configmaps/{GET_NAME}, LIST /api/v1/namespaces/{NAMESPACE}/configmaps",
        "- peers: direct = kube-apiserver over HTTPS (admin client certificate); "
        "kproxy = `kproxy run`, no filters, credentials: proxy, HTTP; "
        "kubectl proxy = `kubectl proxy --disable-filter=true`, HTTP",
    ]


def report(
    results: dict[tuple[str, str], Measurement],
    scen: Sequence[Scenario],
    peers: Sequence[str],
    context: Sequence[str],
) -> tuple[str, bool]:
    """The markdown report, and whether every measurement ran without errors."""
    n = ncpu()
    clean = True
    lines = ["## kproxy benchmark", "", *context, ""]
    lines += [
        "| scenario | peer | p50 ms | p99 ms | req/s | errors | KiB/resp | p50 vs direct | req/s vs direct |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for s in scen:
        direct = results.get((s.name, DIRECT))
        for p in peers:
            m = results[(s.name, p)]
            if m.failed:
                clean = False
                why = "; ".join(m.check_errors) or "no successful request"
                lines.append(f"| {s.name} | {p} | - | - | - | FAILED: {why} | - | - | - |")
                continue
            errors = str(m.error_count)
            if m.error_count:
                clean = False
                errors = f"**{m.error_count}** ({', '.join(f'{k}: {v}' for k, v in m.errors.items())})"
            enc = "" if m.encodings <= {"identity"} else f" ({'/'.join(sorted(m.encodings))})"
            base = direct if direct is not None and not direct.failed else None
            lines.append(
                f"| {s.name} | {p} | {num(m.p50)} | {num(m.p99)} | {m.rps:.0f} | {errors} | "
                f"{num(m.kib_per_response, 1)}{enc} | "
                f"{ratio(m.p50, base.p50 if base else None)} | {ratio(m.rps, base.rps if base else None)} |"
            )

    if KPROXY in peers and KUBECTL in peers:
        lines += [
            "",
            "### kproxy vs kubectl proxy",
            "",
            "Added p50 = the peer's p50 minus direct's p50 (the latency the proxy hop adds).",
            "",
            "The per-round column compares the two peers within each round (measured back to back), "
            "so that the machine's speed drifting between rounds cancels out: median (lowest-highest).",
            "",
            "| scenario | added p50 kproxy ms | added p50 kubectl proxy ms | p50 kproxy/kubectl | "
            "p99 kproxy/kubectl | req/s kproxy/kubectl | req/s kproxy/kubectl per round | goal met |",
            "|---|--:|--:|--:|--:|--:|--:|---|",
        ]
        met_all = True
        for s in scen:
            k, c, d = results[(s.name, KPROXY)], results[(s.name, KUBECTL)], results.get((s.name, DIRECT))
            if k.failed or c.failed:
                met_all = False
                lines.append(f"| {s.name} | - | - | - | - | - | - | no data |")
                continue
            add_k: float | None
            add_c: float | None
            if d is not None and not d.failed:
                add_k, add_c = k.p50 - d.p50, c.p50 - d.p50
                latency_ok = add_k <= add_c
            else:  # without direct, the same comparison on the peers' own p50
                add_k = add_c = None
                latency_ok = k.p50 <= c.p50
            met = latency_ok and k.rps >= c.rps and not (k.error_count or c.error_count)
            met_all = met_all and met
            misses = []
            if not latency_ok:
                extra = add_k - add_c if add_k is not None and add_c is not None else k.p50 - c.p50
                misses.append(f"p50 +{extra:.2f} ms")
            if k.rps < c.rps:
                misses.append(f"req/s {(k.rps / c.rps - 1) * 100:.1f}%")
            verdict = "yes" if met else f"**no** ({', '.join(misses) or 'errors'})"
            lines.append(
                f"| {s.name} | {num(add_k)} | {num(add_c)} | {ratio(k.p50, c.p50)} | {ratio(k.p99, c.p99)} | "
                f"{ratio(k.rps, c.rps)} | {per_round(k.round_rps, c.round_rps)} | {verdict} |"
            )
        lines += [
            "",
            "Goal: kproxy adds no more p50 latency than kubectl proxy and serves at least as many requests/s: "
            + ("**met in every scenario**." if met_all else "**not met in every scenario** (see above)."),
        ]

    lines += [
        "",
        "### CPU per request (ms of CPU time, all threads, during the measured windows)",
        "",
        f"The last two columns: share of the machine's {n} CPUs used by these four processes, "
        "and by anything else running at the same time.",
        "",
        "| scenario | peer | load generator | proxy | kube-apiserver | etcd | CPU used, benchmark | CPU used, others |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    busiest_others = 0.0
    for s in scen:
        for p in peers:
            m = results[(s.name, p)]
            if m.failed:
                continue
            ours, others = m.cpu_busy(n)
            if others == others:  # not NaN
                busiest_others = max(busiest_others, others)
            lines.append(
                f"| {s.name} | {p} | {num(m.cpu_ms_per_request('loadgen'), 3)} | "
                f"{num(m.cpu_ms_per_request('proxy'), 3)} | {num(m.cpu_ms_per_request('apiserver'), 3)} | "
                f"{num(m.cpu_ms_per_request('etcd'), 3)} | {num(ours * 100, 0)}% | {num(others * 100, 0)}% |"
            )
    if busiest_others > NOISY_OTHERS:
        lines += [
            "",
            f"**WARNING: other processes used up to {busiest_others * 100:.0f}% of the machine during a "
            "measurement; the numbers are noisy. Run again on a quiet machine.**",
        ]
    if not clean:
        lines += ["", "**WARNING: some measurements had errors or failed; their numbers are not comparable.**"]
    return "\n".join(lines) + "\n", clean


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.proxies",
        description="Latency and requests/s of the kube-apiserver direct, through kproxy and through kubectl proxy.",
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per scenario and peer (10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measurement (2)")
    p.add_argument("--rounds", type=int, default=1, help="measure each scenario and peer N times, pooled (1)")
    p.add_argument("--concurrency-get", type=int, default=16, help="concurrent workers for GET (16)")
    p.add_argument("--concurrency-list", type=int, default=4, help="concurrent workers for LIST (4)")
    p.add_argument("--no-gzip", action="store_true", help="skip the LIST with Accept-Encoding: gzip")
    p.add_argument(
        "--peers",
        default=",".join(PEER_CHOICES),
        help=f"comma-separated subset of {','.join(PEER_CHOICES)} (all)",
    )
    p.add_argument(
        "--envtest-dir",
        type=Path,
        help="reuse the control plane of `kproxy envtest up --dir DIR` instead of starting one",
    )
    p.add_argument("--output", type=Path, help="also write the markdown report to this file")
    args = p.parse_args(argv)
    names = [x.strip() for x in args.peers.split(",") if x.strip()]
    if not names or any(x not in PEER_CHOICES for x in names):
        p.error(f"--peers takes a comma-separated subset of {','.join(PEER_CHOICES)}")
    args.peer_names = [PEER_CHOICES[x] for x in PEER_CHOICES if x in names]
    if args.duration <= 0 or args.warmup < 0 or args.rounds < 1:
        p.error("--duration must be > 0, --warmup >= 0 and --rounds >= 1")
    if args.concurrency_get < 1 or args.concurrency_list < 1:
        p.error("concurrency must be at least 1")
    return args


def _on_sigterm(signum: int, frame: object) -> None:
    log("terminated; stopping what this run started")
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop what we started


def bench(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()
    scen = scenarios(args.concurrency_get, args.concurrency_list, gzip=not args.no_gzip)
    peer_names: list[str] = args.peer_names
    with contextlib.ExitStack() as stack:
        info = stack.enter_context(control_plane(args.envtest_dir))
        work = stack.enter_context(work_dir())
        k8s = k8s_server_version(info)
        log(f"control plane {info.server} ({k8s}); creating {CONFIGMAPS} ConfigMaps in namespace {NAMESPACE} ...")
        seed_configmaps(info)

        cp_pids = {"apiserver": info.apiserver_pid, "etcd": info.etcd_pid}
        peers: dict[str, Peer] = {}
        if DIRECT in peer_names:
            peers[DIRECT] = Peer(
                DIRECT, info.server, TLSFiles(str(info.ca_file), str(info.admin_cert), str(info.admin_key))
            )
        for name, start in ((KPROXY, start_kproxy), (KUBECTL, start_kubectl_proxy)):
            if name in peer_names:
                log(f"starting {name} ...")
                proc, peers[name] = start(work, info)
                stack.callback(proc.stop)

        results = {(s.name, p): Measurement() for s in scen for p in peer_names}
        for rnd in range(args.rounds):
            order = peer_names[rnd % len(peer_names) :] + peer_names[: rnd % len(peer_names)]
            for s in scen:
                for name in order:
                    peer = peers[name]
                    pids = {k: v for k, v in cp_pids.items() if v is not None}
                    if peer.pid is not None:
                        pids["proxy"] = peer.pid
                    spec = LoadSpec(
                        url=peer.base_url + s.path,
                        concurrency=s.concurrency,
                        duration=args.duration,
                        warmup=args.warmup,
                        headers=s.headers,
                        expect=s.expect,
                        tls=peer.tls,
                        pids=pids,
                    )
                    r = run_in_process(asdict(spec), timeout=args.warmup + args.duration + 120)
                    results[(s.name, name)].add(r)
                    log(_progress(rnd, args.rounds, s, name, r))

        text, clean = report(results, scen, peer_names, context_lines(args, k8s, load_before))
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        log(f"wrote {args.output}")
    return 0 if clean else 1


def _progress(rnd: int, rounds: int, s: Scenario, peer: str, r: LoadResult) -> str:
    prefix = f"[{rnd + 1}/{rounds}] {s.name:<16} {peer:<14}"
    if r.check_error:
        return f"{prefix} FAILED: {r.check_error}"
    lat = r.latencies_ms
    errors = sum(r.errors.values())
    return (
        f"{prefix} p50 {percentile(lat, 50):7.2f} ms  p99 {percentile(lat, 99):7.2f} ms  "
        f"{r.ok / r.window_s:7.0f} req/s  errors {errors}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return bench(args)
    except (BenchError, envtest.EnvtestError, envtest.KubectlError) as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
