"""Command line: ``kproxy run | kubeconfig | envtest | check-config | version``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from kproxy import __version__
from kproxy.config import Config, ConfigError, load_config, with_overrides

log = logging.getLogger("kproxy")


def _config_from_args(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    return with_overrides(
        cfg,
        **{
            "upstream.kubeconfig": getattr(args, "kubeconfig", None),
            "upstream.context": getattr(args, "context", None),
            "listen": getattr(args, "listen", None),
            "admin_listen": getattr(args, "admin_listen", None),
            "log.level": getattr(args, "log_level", None),
            "log.format": getattr(args, "log_format", None),
        },
    )


async def _serve(cfg: Config, args: argparse.Namespace) -> int:
    # lazy: the server stack (aiohttp, the filters) is loaded by `run` alone; other commands stay light
    from kproxy import gctuning
    from kproxy.filters import build_filters
    from kproxy.server.kubeconfig import resolve_upstream
    from kproxy.server.proxy import ProxyServer
    from kproxy.server.reload import Reloader

    target = resolve_upstream(cfg.upstream.kubeconfig, cfg.upstream.context)
    server = ProxyServer(cfg, target, build_filters(cfg))
    # Before start(): the persisted caches it loads and the first answers it serves do not wait
    # for a walk of the start-up heap (collection was held since cmd_run; this resumes it).
    gctuning.freeze_started()
    # Command-line overrides apply to every reload too.
    reloader = Reloader(server, lambda: _config_from_args(args), args.config, cfg.reload_interval)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloads: set[asyncio.Task[bool]] = set()

    def on_hup() -> None:
        task = loop.create_task(reloader.reload("SIGHUP"))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    try:
        await server.start()
    except ConfigError:
        await server.close_unstarted()
        raise
    ok, reason = await server.upstream_ready()
    if not ok:
        # Serve anyway (an apiserver that is restarting comes back; a sidecar must not crash-loop), but say so once.
        log.warning(
            "the upstream kube-apiserver %s is not ready: %s; kproxy serves meanwhile (reads get 429 with "
            "Retry-After, /readyz answers 503) and carries on when it is",
            server.upstream.base,
            reason,
        )
    gctuning.observe_pauses(server.metrics.gc_pause)
    loop.add_signal_handler(signal.SIGHUP, on_hup)
    reloader.start()
    await stop.wait()
    log.info("signal received, shutting down", extra={"deadline_s": server.cfg.shutdown_timeout})
    await reloader.stop()
    await server.shutdown()
    gctuning.observe_pauses(None)
    log.info("stopped")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    # lazy: as in _serve, only `run` sets up logging
    from kproxy.logs import setup_logging

    cfg = _config_from_args(args)
    setup_logging(cfg.log.level, cfg.log.format)
    # No collection while the server stack is imported and built (its objects all live as long as
    # the process); _serve collects once and freezes them before the server starts.
    gc.disable()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(cfg, args))


def _loop_factory() -> Any:
    """uvloop when installed (measured faster for proxied requests, docs/developing/dependencies.md), unless
    KPROXY_EVENT_LOOP=asyncio asks for the stdlib loop."""
    if os.environ.get("KPROXY_EVENT_LOOP", "auto") == "asyncio":
        return None
    try:
        # lazy: uvloop is optional (not on Windows; KPROXY_EVENT_LOOP=asyncio opts out)
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def cmd_check_config(args: argparse.Namespace) -> int:
    # lazy: as in _serve, the filters (and aiohttp) are loaded only by the commands that build them
    from kproxy.core.chain import ShowsSettings
    from kproxy.filters import build_filters

    cfg = _config_from_args(args)
    filters = build_filters(cfg)
    scheme = "https" if cfg.tls else "http"
    print(f"config {args.config}: OK")
    print(f"listen:       {scheme}://{cfg.listen.host}:{cfg.listen.port}")
    print(f"admin_listen: http://{cfg.admin_listen.host}:{cfg.admin_listen.port}")
    print(f"credentials:  {cfg.credentials}")
    print(f"upstream:     {cfg.upstream.kubeconfig or '(KUBECONFIG, in-cluster, or ~/.kube/config)'}")
    print("chain:")
    for i, (flt, entry) in enumerate(zip(filters, cfg.filters, strict=True)):
        settings: Any = getattr(flt, "settings", None)
        if isinstance(flt, ShowsSettings):
            shown = flt.effective_settings()
        else:
            shown = settings.model_dump() if hasattr(settings, "model_dump") else entry.settings
        print(f"  {i + 1}. {entry.name} {yaml.safe_dump(shown, default_flow_style=True).strip()}")
    print("  -> upstream kube-apiserver")
    return 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    cfg = _config_from_args(args)
    host = cfg.listen.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if cfg.tls else "http"
    cluster: dict[str, Any] = {"server": f"{scheme}://{host}:{cfg.listen.port}"}
    if cfg.tls and args.certificate_authority:
        cluster["certificate-authority"] = str(Path(args.certificate_authority).resolve())
    user: dict[str, Any] = {}
    if args.token:
        user["token"] = args.token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kproxy", "cluster": cluster}],
        "users": [{"name": "kproxy", "user": user}],
        "contexts": [{"name": "kproxy", "context": {"cluster": "kproxy", "user": "kproxy"}}],
        "current-context": "kproxy",
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.chmod(0o600)
        print(f"wrote {out}: KUBECONFIG={out} kubectl get ns", file=sys.stderr)
    return 0


#: Flags that an environment variable sets when the flag is not given (flag > environment > config file).
ENV_FLAGS = {
    "config": "KPROXY_CONFIG",
    "kubeconfig": "KPROXY_KUBECONFIG",
    "context": "KPROXY_CONTEXT",
    "listen": "KPROXY_LISTEN",
    "admin_listen": "KPROXY_ADMIN_LISTEN",
    "log_level": "KPROXY_LOG_LEVEL",
    "log_format": "KPROXY_LOG_FORMAT",
}


def _env(dest: str) -> str | None:
    return os.environ.get(ENV_FLAGS[dest]) or None


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", "-c", default=_env("config"), help="YAML config file (see config.example.yaml) [$KPROXY_CONFIG]"
    )
    p.add_argument(
        "--kubeconfig",
        default=_env("kubeconfig"),
        help="kubeconfig of the upstream apiserver (default: $KUBECONFIG, in-cluster, ~/.kube/config)"
        " [$KPROXY_KUBECONFIG]",
    )
    p.add_argument("--context", default=_env("context"), help="kubeconfig context to use [$KPROXY_CONTEXT]")
    p.add_argument(
        "--listen",
        default=_env("listen"),
        help="HOST:PORT of the proxy listener (default 127.0.0.1:8001) [$KPROXY_LISTEN]",
    )
    p.add_argument(
        "--admin-listen",
        default=_env("admin_listen"),
        help="HOST:PORT of the admin listener: /metrics, /healthz, /readyz (default 127.0.0.1:9099)"
        " [$KPROXY_ADMIN_LISTEN]",
    )


def _sub(sub: Any, name: str, help_: str, examples: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=help_[0].upper() + help_[1:] + ".",
        epilog="examples:\n" + examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


_EXAMPLES = """examples:
  kproxy run --config config.recommended.yaml          proxy $KUBECONFIG's cluster with every filter
  kproxy kubeconfig --config config.recommended.yaml > kproxy.kubeconfig
  kproxy check-config config.recommended.yaml          validate a config, print the chain in effect
  kproxy envtest run --dir .cache/run --config config.recommended.yaml
                                                       a local living cluster through kproxy (make run)

Every flag of run and kubeconfig can be set from the environment: KPROXY_CONFIG, KPROXY_KUBECONFIG,
KPROXY_CONTEXT, KPROXY_LISTEN, KPROXY_ADMIN_LISTEN, KPROXY_LOG_LEVEL, KPROXY_LOG_FORMAT (a flag wins).
Docs: README.md and docs/README.md."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kproxy",
        description="A Kubernetes API gateway: a filter chain in front of a real kube-apiserver.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kproxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = _sub(
        sub,
        "run",
        "run the proxy in front of the upstream kube-apiserver",
        "  kproxy run                                  defaults: 127.0.0.1:8001, no filters, $KUBECONFIG's cluster\n"
        "  kproxy run -c config.recommended.yaml --listen 127.0.0.1:8443\n"
        "  KPROXY_LOG_LEVEL=debug kproxy run -c kproxy.yaml --context staging",
    )
    _common(run)
    run.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=_env("log_level"),
        help="log threshold (default: the config's log.level, info) [$KPROXY_LOG_LEVEL]",
    )
    run.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=_env("log_format"),
        help="log lines as text or one JSON object each (default: the config's log.format, text) [$KPROXY_LOG_FORMAT]",
    )
    run.set_defaults(func=cmd_run)

    check = _sub(
        sub,
        "check-config",
        "validate a config and print the chain with the settings in effect",
        "  kproxy check-config config.recommended.yaml\n  kproxy check-config /etc/kproxy/config.yaml || exit 1",
    )
    check.add_argument("config", help="YAML config file")
    check.set_defaults(func=cmd_check_config)

    kc = _sub(
        sub,
        "kubeconfig",
        "print a kubeconfig whose server is the proxy's listener",
        "  kproxy kubeconfig -c config.recommended.yaml > kproxy.kubeconfig\n"
        '  kproxy kubeconfig -c kproxy.yaml --token "$TOKEN" --certificate-authority ca.crt -o kproxy.kubeconfig',
    )
    _common(kc)
    kc.add_argument("--output", "-o", default="-", help="file to write (0600), or - for stdout (default)")
    kc.add_argument("--token", help="bearer token to put in the kubeconfig (credentials: forward)")
    kc.add_argument("--certificate-authority", help="CA of the proxy's serving certificate (tls)")
    kc.set_defaults(func=cmd_kubeconfig)

    env = _sub(
        sub,
        "envtest",
        "a local control plane (etcd, kube-apiserver; with --components the controllers and KWOK nodes)",
        "  kproxy envtest up --dir /tmp/cp                 etcd + kube-apiserver\n"
        "  kproxy envtest up --dir /tmp/cp --components proxied --config config.recommended.yaml\n"
        "  kproxy envtest run --dir .cache/run --config config.recommended.yaml   (make run)\n"
        "  kproxy envtest down --dir /tmp/cp\n"
        "  kproxy envtest --help                           every subcommand and flag",
    )
    env.add_argument("rest", nargs=argparse.REMAINDER)
    env.set_defaults(func=None)

    ver = _sub(sub, "version", "print the version", "  kproxy version")
    ver.set_defaults(func=lambda _a: print(f"kproxy {__version__}") or 0)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["envtest"]:
        # lazy: the local cluster is loaded for the envtest command only; the container image does
        # not carry it (.dockerignore): `kproxy run` never needs it.
        try:
            from kproxy.localcluster.envtest import main as envtest_main
        except ModuleNotFoundError as err:
            if err.name not in ("kproxy.localcluster", "kproxy.localcluster.envtest"):
                raise
            print(
                "kproxy: envtest: the local cluster (kproxy.localcluster) is not installed here: the container"
                " image carries `kproxy run` only; install the kproxy wheel, or use a checkout (make run)",
                file=sys.stderr,
            )
            return 2
        return envtest_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except ConfigError as err:
        print(f"kproxy: config error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The console script: a reader that goes away (``| head``) ends the output quietly."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    entry()
