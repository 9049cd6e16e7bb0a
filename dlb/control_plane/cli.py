"""``dlb serve control-plane``: the xDS server, the flow loop and the status endpoint, reloaded on SIGHUP."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import TYPE_CHECKING

from dlb.config import ConfigError, load_config
from dlb.config.cli import add_moved_flags
from dlb.errors import UsageError
from dlb.log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from dlb.envoy.tracing import EnvoyTracing

log = get_logger("dlb.control_plane")


def register_serve(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("control-plane", help="serve xDS to root/leaf Envoys and DLB services; run the flow loop")
    p.add_argument("--config", required=True, help="DLB config YAML (reloaded on SIGHUP, and on change with --watch-config)")
    p.add_argument("--xds", default=None, help="xDS listen address host:port (default services.control_plane.xds)")
    p.add_argument("--status", default=None, help="status/metrics HTTP address host:port (default services.control_plane.status)")
    p.add_argument("--xds-transport", choices=("h2", "grpc"), default="h2",
                   help="serve xDS on DLB's own HTTP/2 server (default: about half grpc.aio's CPU per push) or on grpc.aio")
    p.add_argument("--emulate-wan", action="store_true", help="leaf Envoys delay requests by the source cell's RTT (testbeds)")
    p.add_argument("--no-probe", action="store_true", help="do not probe leaves (serve the config only; no flow updates)")
    p.add_argument("--serve-cells", default=None, metavar="A,B",
                   help="build snapshots and flow loops for these cells only (one control plane per cluster); "
                        "every leaf is still probed (default: every cell)")
    p.add_argument("--root-reuse-port", action="store_true",
                   help="root listeners share their port (SO_REUSEPORT): several root Envoys per cell on one host")
    p.add_argument("--watch-config", action="store_true",
                   help="reload when the config file changes, as on SIGHUP (follows a Kubernetes ConfigMap's symlink swap)")
    p.add_argument("--watch-period-s", type=float, default=1.0, help="how often --watch-config checks the file")
    p.add_argument("--ready-file", default=None, help="write {xds, status, pid} JSON here once serving (testbeds, benches)")
    p.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/gRPC collector host:port the root and leaf Envoys it configures send spans to (default: off)")
    p.add_argument("--trace-sample-ratio", type=float, default=None,
                   help="share of requests without a traceparent the Envoys trace (default 0.01; "
                        "needs --otlp-endpoint)")
    add_moved_flags(p, {"--mnlb": "policy.plugins: [{type: mnlb}]"})
    p.set_defaults(func=run_serve)


def envoy_tracing(args: argparse.Namespace) -> EnvoyTracing | None:
    """The Envoys' tracer from ``--otlp-endpoint`` / ``--trace-sample-ratio`` (None: off); UsageError naming the flag."""
    from dlb.config import parse_hostport
    from dlb.envoy.tracing import EnvoyTracing
    from dlb.service.tracing import sample_ratio

    ratio = sample_ratio(args)
    if not args.otlp_endpoint:
        return None
    otlp = parse_hostport(args.otlp_endpoint)
    if otlp is None:
        raise UsageError(f"--otlp-endpoint: {args.otlp_endpoint!r} is not host:port")
    try:
        return EnvoyTracing(otlp, ratio)
    except ValueError as e:
        raise UsageError(f"--trace-sample-ratio: {e}") from None


def run_serve(args: argparse.Namespace) -> int:
    args.envoy_tracing = envoy_tracing(args)  # a bad flag is refused before anything starts
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 1
    if args.serve_cells is not None:
        args.serve_cells = [c.strip() for c in args.serve_cells.split(",") if c.strip()]
        unknown = [c for c in args.serve_cells if c not in config.cell_names]
        if not args.serve_cells or unknown:
            print(f"--serve-cells: {', '.join(unknown) or '(empty)'} not a cell of {args.config} "
                  f"(cells: {', '.join(config.cell_names)})", file=sys.stderr)
            return 1
    if args.watch_period_s <= 0:
        print("--watch-period-s must be > 0", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        pass
    return asyncio.run(_serve(config, args))


async def _serve(config, args: argparse.Namespace) -> int:
    from dlb.control_plane.reload import Reloader
    from dlb.control_plane.service import ControlPlane
    from dlb.gc_heap import GcPauses, freeze_heap, raise_young_threshold
    from dlb.service.loop_lag import LoopLag
    from dlb.service.metrics import CallbackCollector

    cp = ControlPlane(config, emulate_wan=args.emulate_wan, probe=not args.no_probe, serve_cells=args.serve_cells,
                      root_reuse_port=args.root_reuse_port, tracing=args.envoy_tracing, xds_transport=args.xds_transport)
    xds_port, status_port = await cp.start(args.xds, args.status)
    loop = asyncio.get_running_loop()

    async def reload_now() -> None:
        # Parse off the event loop: even a file at the loader's budgets must not freeze xDS and the flow loop.
        # Whatever goes wrong, the running config stays and the log says "reload refused: <why>".
        problems: list[str] = []
        try:
            config = await asyncio.to_thread(load_config, args.config)
            cp.reload(config)
            return
        except ConfigError as e:
            problems = [str(p) for p in e.problems[:50]]
            why = f"{len(e.problems)} problem(s) in config, first: {problems[0]}"
        except Exception as e:  # a loader bug must not take the serving control plane down
            why = f"{type(e).__name__}: {str(e)[:500]}"
        cp.reloads.count["refused"] += 1
        log.error("config_reload_refused", message=f"reload refused: {why}", problems=problems)

    # A signal during a reload queues another (the latest file wins): dlb.control_plane.reload.
    reload = Reloader(reload_now).request

    # Installed before the ready file: a SIGHUP from then on reloads instead of killing the process.
    loop.add_signal_handler(signal.SIGHUP, reload)
    # Start-up state never becomes garbage: freeze it so a full collection (which a hostile client's
    # allocations trigger) walks only what came since; it blocked the loop 38-101 ms (issue 14 row 6).
    # The young generation is collected less often: each xDS push allocates, see dlb.gc_heap.YOUNG_THRESHOLD.
    pauses = GcPauses("dlb_xds").install()
    cp.status_server.registry.register(CallbackCollector(pauses.families))
    loop_lag = LoopLag("dlb_xds").start()  # how late the xDS pushes, the flow loop and the probes ran
    cp.status_server.registry.register(CallbackCollector(loop_lag.families))
    log.info("heap_frozen", objects=freeze_heap(), gc_thresholds=raise_young_threshold())
    from dlb.envoy.root_token import forgeable_token_warning

    if warning := forgeable_token_warning(config):
        log.warning("root_token_forgeable", message=warning)
    from dlb.config.policy import unused_warmup_warning

    if warning := unused_warmup_warning(config):
        log.warning("flow_warmup_unused", message=warning)
    from dlb.config.priors import unused_prior_warning

    if warning := unused_prior_warning(config):
        log.warning("latency_prior_unused", message=warning)
    from dlb.config.tls_check import plaintext_warning

    if warning := plaintext_warning(config):
        log.warning("grpc_plaintext", message=warning)
    if args.ready_file:
        import os

        from dlb.service.runner import write_ready

        write_ready(args.ready_file, {"xds": xds_port, "status": status_port, "pid": os.getpid()})
    stop = asyncio.Event()
    watcher = None
    if args.watch_config:
        from dlb.control_plane.watch import watch

        watcher = asyncio.create_task(watch(args.config, reload, args.watch_period_s), name="watch-config")
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control_plane_stopping")
    loop_lag.stop()
    if watcher is not None:
        watcher.cancel()
    await cp.stop()
    return 0
