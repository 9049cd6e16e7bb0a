"""``dlb serve root``: runs a :class:`RootService` with its probe client, xDS subscription and metrics.

Kept apart from :mod:`dlb.ext_proc.root` (the request path) so that the root's xDS sync can import the
service without a cycle: ``root_serve`` → ``root_xds`` → ``root``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import numpy as np

from dlb.config import Config, tls_live
from dlb.config.tls_live import component_identity
from dlb.ext_proc.protocol import ExtProcServer, MessageHandler
from dlb.ext_proc.root import RootService, log
from dlb.ext_proc.root_xds import ProbeManager, RootXdsSync, config_probes, probe_targets
from dlb.gc_heap import GcPauses, freeze_heap
from dlb.probe.client import ProbeTiming
from dlb.service.loop_lag import LoopLag
from dlb.service.metrics import CallbackCollector, Readiness, serve_metrics
from dlb.service.runner import spawn_workers, wait_worker, write_ready
from dlb.service.serve import serve_until_signal
from dlb.service.tracing import TracingOptions, make_tracer
from dlb.transport.limits import H2Limits


async def _tick_loop(service: RootService) -> None:
    while True:
        try:
            service.tick(service.clock())
        except Exception:  # a numerical surprise must not stop routing updates forever
            log.exception("tick_failed")
        # Re-read every time: an xDS reload may change the endpoints' flow periods.
        await asyncio.sleep(min([0.05] + [e.router.policy.flow.period_s / 2 for e in service.endpoints]))


@dataclass(frozen=True)
class RootOptions:
    """How one root process runs, as ``dlb serve root`` builds it from its flags (the config gives the rest)."""

    cell: str
    #: The ext_proc listener ``host:port``.
    listen: str
    #: Prometheus ``host:port`` (None: off).
    metrics: str | None = None
    #: Write ``{ext_proc, metrics, pid, worker_pids}`` JSON here once serving.
    ready_file: str | None = None
    seed: int | None = None
    #: Testbeds: delay each probe by the one-way latency both ways.
    emulate_wan: bool = False
    #: Processes sharing the port (``SO_REUSEPORT``), and this one's index (0 starts the others).
    workers: int = 1
    worker_index: int = 0
    #: Control plane ``host:port`` to take (and follow) the routing config from.
    xds: str | None = None
    xds_delta: bool = False
    #: ``h2`` (DLB's HTTP/2 transport) or ``grpc`` (grpc.aio).
    transport: str = "h2"
    limits: H2Limits | None = None
    #: Seconds of NOT_SERVING on SIGTERM before the listener closes.
    drain_s: float = 0.0
    #: A span per decision to an OTLP collector (off unless it names one).
    tracing: TracingOptions = field(default_factory=TracingOptions)


async def run_root(cfg: Config | None, opts: RootOptions) -> None:
    """Serve until SIGTERM. With ``opts.workers > 1`` this process (index 0) starts the others on the same
    port (``SO_REUSEPORT``; the kernel spreads Envoy's connections) — each is an independent root
    replica with its own probe client and router state, which is how the algorithms see several roots.

    With ``opts.xds`` the routing configuration comes from the control plane (and follows it); ``cfg``,
    when also given, is only the starting point.

    On SIGTERM the gRPC health status turns NOT_SERVING for ``opts.drain_s`` (streams keep being served),
    then the listener closes and the streams in flight finish before the process exits.
    """
    cell = opts.cell
    if cfg is not None:
        service = RootService.from_config(cfg, cell, seed=opts.seed)
        p = cfg.probe
        timing = ProbeTiming(p.period_ms / 1000, p.timeout_ms / 1000, p.backoff_max_ms / 1000)
    else:
        service = RootService(cell=cell, cell_names=(), endpoints=[], responses=[], rng=np.random.default_rng(opts.seed))
        timing = ProbeTiming()
    # mTLS (the config's ``tls`` section) on the ext_proc listener, the probes and the xDS stream.
    tls = component_identity(cfg.tls, "root", cell, cfg.source) if cfg is not None else None
    probes = ProbeManager(service, timing, cell, tls)
    if cfg is not None:
        await probes.retarget(probe_targets(cfg.topology(), cell, config_probes(cfg), opts.emulate_wan))
    sync = RootXdsSync(service, opts.xds, cell, probes, emulate_wan=opts.emulate_wan, delta=opts.xds_delta) if opts.xds else None
    tracer = make_tracer(opts.tracing)
    handle: MessageHandler = service.handle
    if tracer is not None:
        from dlb.ext_proc.tracing import describe_root, traced

        handle = traced(service.handle, tracer, "dlb.root.decide", describe_root(service))
    server = ExtProcServer(opts.transport, handle, opts.limits, tls=tls)
    port = await server.bind(opts.listen, reuse_port=opts.workers > 1)
    # /readyz: the listener is bound (cleared when draining), the routing config is in (over xDS when
    # following it) and every endpoint has a cell it may send to now, with a fresh probe.
    readiness = Readiness(ready=True)
    service.transport_stats = server.stats
    children: list = []
    metrics_port = None
    gc_pauses = GcPauses("dlb_root")  # timed from the freeze on (the freeze's own collection is start-up)
    loop_lag = LoopLag("dlb_root")  # beats from the freeze on, for the same reason
    if opts.metrics:
        host, _, mport = opts.metrics.rpartition(":")
        registry, metrics_port = serve_metrics(service.collect, host.strip("[]") or "127.0.0.1", int(mport),
                                               lambda: readiness.ready and (sync is None or sync.reloads > 0) and service.routable(),
                                               prefix="dlb_root")
        registry.register(CallbackCollector(gc_pauses.families))
        registry.register(CallbackCollector(loop_lag.families))
        if tls is not None:
            registry.register(CallbackCollector(lambda: tls_live.COUNTS.families("dlb_root")))
    if opts.workers > 1 and opts.worker_index == 0:
        children = spawn_workers(opts.workers, f"{opts.listen.rpartition(':')[0]}:{port}", opts.metrics)
    if sync is not None:
        await sync.start()
    ticker = asyncio.create_task(_tick_loop(service))
    # Start-up state (modules, protobuf descriptors, the config) never becomes garbage: frozen, a full
    # collection walks only what came since — what a hostile client's connections made the loop wait
    # for (issue 14 row 3; the control plane's row-6 fix).
    freeze_heap()
    gc_pauses.install()
    if opts.metrics:  # nobody reads the beats otherwise
        loop_lag.start()
    log.info("root_started", cell=cell, ext_proc=f"{opts.listen.rpartition(':')[0]}:{port}", metrics_port=metrics_port,
             endpoints=[e.name for e in service.endpoints], destinations=[t.name for t in probes.targets], xds=opts.xds)
    worker_pids = [await asyncio.to_thread(wait_worker, c) for c in children]
    if opts.ready_file:
        write_ready(opts.ready_file, {"ext_proc": port, "metrics": metrics_port, "pid": os.getpid(), "worker_pids": worker_pids})

    async def on_stop() -> None:
        readiness.ready = False
        ticker.cancel()
        loop_lag.stop()
        for child, _ in children:
            child.terminate()
        if sync is not None:
            await sync.stop()
        await probes.stop()
        for child, _ in children:
            await asyncio.to_thread(child.wait, 10)
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)  # the spans still buffered
        log.info("root_stopping", cell=cell, worker=opts.worker_index)

    # The drain is for the root Envoy: it ends early once no Envoy is connected (stopped with this service).
    await serve_until_signal(server, on_stop, health=server.health, drain_s=opts.drain_s, audience=server.has_clients)
