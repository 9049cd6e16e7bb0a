"""``dlb serve root``: runs a :class:`RootService` with its probe client, xDS subscription and metrics.

Kept apart from :mod:`dlb.ext_proc.root` (the request path) so that the root's xDS sync can import the
service without a cycle: ``root_serve`` → ``root_xds`` → ``root``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import resource

import numpy as np

from dlb.config import Config
from dlb.config.tls import component_identity
from dlb.ext_proc.protocol import ExtProcServer, load_cell
from dlb.ext_proc.root import RootService, log
from dlb.ext_proc.root_xds import ProbeManager, RootXdsSync, probe_targets
from dlb.ext_proc.transport.limits import FD_RESERVE, H2Limits
from dlb.gc_heap import GcPauses, freeze_heap
from dlb.probe.client import ProbeTiming
from dlb.service.metrics import CallbackCollector, Readiness, serve_metrics
from dlb.service.runner import die_with_parent, run_event_loop, spawn_workers, wait_worker, write_ready
from dlb.service.serve import serve_until_signal


async def _tick_loop(service: RootService) -> None:
    while True:
        try:
            service.tick(service.clock())
        except Exception:  # a numerical surprise must not stop routing updates forever
            log.exception("tick_failed")
        # Re-read every time: an xDS reload may change the endpoints' flow periods.
        await asyncio.sleep(min([0.05] + [e.router.policy.flow.period_s / 2 for e in service.endpoints]))


async def run_root(cfg: Config | None, cell: str, listen: str, metrics: str | None, ready_file: str | None = None,
                   seed: int | None = None, emulate_wan: bool = False, workers: int = 1, worker_index: int = 0,
                   xds: str | None = None, xds_delta: bool = False, transport: str = "h2",
                   limits: H2Limits | None = None, drain_s: float = 0.0) -> None:
    """Serve until SIGTERM. With ``workers > 1`` this process (index 0) starts the others on the same
    port (``SO_REUSEPORT``; the kernel spreads Envoy's connections) — each is an independent root
    replica with its own probe client and router state, which is how the algorithms see several roots.

    With ``xds`` the routing configuration comes from the control plane (and follows it); ``cfg``, when
    also given, is only the starting point.

    On SIGTERM the gRPC health status turns NOT_SERVING for ``drain_s`` (streams keep being served),
    then the listener closes and the streams in flight finish before the process exits.
    """
    if cfg is not None:
        service = RootService.from_config(cfg, cell, seed=seed)
        p = cfg.probe
        timing = ProbeTiming(p.period_ms / 1000, p.timeout_ms / 1000, p.backoff_max_ms / 1000)
    else:
        service = RootService(cell=cell, cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(seed))
        timing = ProbeTiming()
    # mTLS (the config's ``tls`` section) on the ext_proc listener, the probes and the xDS stream.
    tls = component_identity(cfg.tls, "root", cell, cfg.source) if cfg is not None else None
    probes = ProbeManager(service, timing, cell, tls)
    if cfg is not None:
        await probes.retarget(probe_targets(cfg.topology(), cell, [str(c.leaf.probe) for c in cfg.cells], emulate_wan))
    sync = RootXdsSync(service, xds, cell, probes, emulate_wan=emulate_wan, delta=xds_delta) if xds else None
    server = ExtProcServer(transport, service.handle, limits, tls=tls)
    port = await server.bind(listen, reuse_port=workers > 1)
    readiness = Readiness(ready=True)  # /readyz: the ext_proc listener is bound; cleared when draining
    service.transport_stats = server.stats
    children: list = []
    metrics_port = None
    gc_pauses = GcPauses("dlb_root")  # timed from the freeze on (the freeze's own collection is start-up)
    if metrics:
        host, _, mport = metrics.rpartition(":")
        registry, metrics_port = serve_metrics(service.collect, host.strip("[]") or "127.0.0.1", int(mport), lambda: readiness.ready)
        registry.register(CallbackCollector(gc_pauses.families))
    if workers > 1 and worker_index == 0:
        children = spawn_workers(workers, f"{listen.rpartition(':')[0]}:{port}", metrics)
    if sync is not None:
        await sync.start()
    ticker = asyncio.create_task(_tick_loop(service))
    # Start-up state (modules, protobuf descriptors, the config) never becomes garbage: frozen, a full
    # collection walks only what came since — what a hostile client's connections made the loop wait
    # for (issue 14 row 3; the control plane's row-6 fix).
    freeze_heap()
    gc_pauses.install()
    log.info("root_started", cell=cell, ext_proc=f"{listen.rpartition(':')[0]}:{port}", metrics_port=metrics_port,
             endpoints=[e.name for e in service.endpoints], destinations=[t.name for t in probes.targets], xds=xds)
    worker_pids = [await asyncio.to_thread(wait_worker, c) for c in children]
    if ready_file:
        write_ready(ready_file, {"ext_proc": port, "metrics": metrics_port, "pid": os.getpid(), "worker_pids": worker_pids})

    async def on_stop() -> None:
        readiness.ready = False
        ticker.cancel()
        for child, _ in children:
            child.terminate()
        if sync is not None:
            await sync.stop()
        await probes.stop()
        for child, _ in children:
            await asyncio.to_thread(child.wait, 10)
        log.info("root_stopping", cell=cell, worker=worker_index)

    await serve_until_signal(server, on_stop, health=server.health, drain_s=drain_s)


def run(args: argparse.Namespace) -> int:
    if args.config is None and args.xds is None:
        raise SystemExit("dlb serve root: give --config FILE, --xds HOST:PORT, or both")
    if args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    if not 0 <= args.drain_s < math.inf:  # nan would skip the drain, inf never close the listener
        raise SystemExit(f"--drain-s must be >= 0 and finite, got {args.drain_s}")
    try:
        limits = H2Limits(max_connections=args.max_connections, max_concurrent_streams=args.max_concurrent_streams,
                          handshake_timeout_s=args.handshake_timeout_s, idle_timeout_s=args.idle_timeout_s)
    except ValueError as exc:  # named by field: H2Limits.max_concurrent_streams -> --max-concurrent-streams
        field_name = str(exc).split()[0].removeprefix("H2Limits.")
        raise SystemExit(f"--{field_name.replace('_', '-')}{str(exc).removeprefix('H2Limits.' + field_name)}") from None
    soft_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_fds != resource.RLIM_INFINITY and args.max_connections > soft_fds - FD_RESERVE:
        # the cap would never be reached: accept() fails with EMFILE first, and probes, xDS and /metrics with it
        raise SystemExit(f"--max-connections must be <= {soft_fds - FD_RESERVE} (the file-descriptor limit {soft_fds} "
                         f"minus {FD_RESERVE} kept for probes, xDS and metrics; raise ulimit -n), got {args.max_connections}")
    cfg = None
    if args.config is not None:
        cfg, cell = load_cell(args.config, args.cell)
        listen = args.listen or str(cell.root.ext_proc or cfg.services.root.ext_proc)
        metrics = args.metrics
        if metrics is None:
            m = cfg.services.root.metrics
            metrics = f"{m.host}:{m.port + cell.index}"  # one metrics port per root on a shared host
    else:
        if args.listen is None:
            raise SystemExit("dlb serve root: --listen is required without --config")
        listen, metrics = args.listen, args.metrics or None
    if args.worker_index > 0:
        die_with_parent()
    seed = None if args.seed is None else args.seed + args.worker_index
    run_event_loop(run_root(cfg, args.cell, listen, metrics or None, args.ready_file, seed, args.emulate_wan,
                            args.workers, args.worker_index, xds=args.xds, xds_delta=args.xds_delta, transport=args.transport,
                            limits=limits, drain_s=args.drain_s))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("root", help="root ext_proc service: picks a cell per request (Envoy ExternalProcessor)")
    p.add_argument("--config", default=None, help="DLB config YAML (optional with --xds: then only the starting point)")
    p.add_argument("--cell", required=True, help="the cell this root serves (source of its traffic)")
    p.add_argument("--xds", default=None, help="control plane host:port: take (and follow) the routing config over xDS")
    p.add_argument("--xds-delta", action="store_true", help="use incremental xDS with the control plane")
    p.add_argument("--listen", default=None, help="gRPC host:port (default: cells[].root.ext_proc, else services.root.ext_proc)")
    p.add_argument("--metrics", default=None,
                   help="Prometheus host:port ('' = off; default services.root.metrics with port + cell index)")
    p.add_argument("--ready-file", default=None, help="write {ext_proc, metrics, pid} JSON here once serving")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (tie-breaks, aversion, flow sampling)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes sharing the port (SO_REUSEPORT); worker k serves metrics on the metrics port + 100k")
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--transport", choices=("h2", "grpc"), default="h2",
                   help="ext_proc server: h2 = DLB's asyncio HTTP/2 gRPC server (default; ~4x less CPU and half the "
                        "latency of grpc.aio, measured in docs/data-plane.md), grpc = grpc.aio")
    d = H2Limits()
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="h2 transport: connections served at once, more are closed at accept "
                        f"(0 = min(4096, file-descriptor limit - {FD_RESERVE}); at most the limit - {FD_RESERVE})")
    p.add_argument("--max-concurrent-streams", type=int, default=d.max_concurrent_streams,
                   help="h2 transport: SETTINGS_MAX_CONCURRENT_STREAMS per connection; more get REFUSED_STREAM (default %(default)s)")
    p.add_argument("--handshake-timeout-s", type=float, default=d.handshake_timeout_s,
                   help="h2 transport: seconds from accept for a new connection to finish the TLS handshake (with tls) "
                        "and send the HTTP/2 preface (default %(default)s; > 0, finite)")
    p.add_argument("--idle-timeout-s", type=float, default=d.idle_timeout_s,
                   help="h2 transport: a connection with no stream open this long is closed (GOAWAY) (default %(default)s; > 0, finite)")
    p.add_argument("--drain-s", type=float, default=1.0,
                   help="on SIGTERM: seconds of NOT_SERVING health (streams still served) before the listener closes (default %(default)s)")
    p.add_argument("--emulate-wan", action="store_true",
                   help="testbeds: delay each probe by the one-way latency both ways (as the leaf Envoy delays requests)")
    p.set_defaults(func=run)
