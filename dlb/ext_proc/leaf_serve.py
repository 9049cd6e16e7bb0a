"""Running the leaf agent (``dlb serve leaf``): its servers, listeners, background tasks and drain.

One gRPC server (grpc.aio + uvloop) carries the probe service (and the ExternalProcessor when it shares
the probe's address); the ExternalProcessor otherwise runs on DLB's HTTP/2 transport on its own address
(``cells[].leaf.ext_proc``); the access log gets a gRPC server of its own on a channel only the cell's
Envoy reaches. Kept apart from the service modules as :mod:`dlb.ext_proc.root_serve` is from the root's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc

from dlb.config import Config, tls_live
from dlb.config.model import LeafPolicy
from dlb.config.tls_live import component_identity
from dlb.envoy.contract import SERVER_CHECK_INTERVAL_S
from dlb.errors import BindError, UsageError
from dlb.ext_proc.leaf import LeafAgent
from dlb.ext_proc.leaf_background import background_body, background_config
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.ext_proc.leaf_xds import LeafXdsSync
from dlb.ext_proc.local_gate import AgentSocketDir, GateError, PeerGate, private_dir
from dlb.ext_proc.protocol import ExtProcServer, MessageHandler, ext_proc_handler
from dlb.log import get_logger
from dlb.proto import probe_pb2_grpc
from dlb.service.grpc_bounds import bounded_options
from dlb.service.health import HealthState, health_handler
from dlb.service.loop_lag import LoopLag
from dlb.service.metrics import CallbackCollector, Readiness, serve_metrics
from dlb.service.ports import add_port
from dlb.service.runner import write_ready
from dlb.service.serve import serve_until_signal
from dlb.service.tracing import TracingOptions, make_tracer

log = get_logger("dlb.leaf")


@dataclass(frozen=True)
class LeafOptions:
    """How one leaf agent runs, as ``dlb serve leaf`` builds it from its flags: process concerns only.
    Routing knobs (pick rule, fit, background probes) come from the config's ``policy`` and later xDS."""

    cell: str
    #: gRPC addresses for probe (+ ext_proc when shared); the first is the probe's.
    listen: tuple[str, ...]
    #: Prometheus ``host:port`` (None: off).
    metrics: str | None = None
    #: Write ``{grpc, grpc_ports, metrics, pid}`` JSON here once serving.
    ready_file: str | None = None
    #: Server ``/metrics`` scrape period (0: off).
    scrape_period_s: float = 0.2
    seed: int | None = None
    #: TCP check of this agent's leaf Envoy (0: off).
    envoy_check_period_s: float = 0.2
    #: Control plane ``host:port`` to follow (server set over EDS, fleet prior, DP groups).
    xds: str | None = None
    xds_delta: bool = False
    #: Serve the ext_proc on this address with DLB's HTTP/2 transport (None: on ``listen``'s gRPC server).
    ext_proc_h2: str | None = None
    #: Seconds of NOT_SERVING on SIGTERM before streams are closed.
    drain_s: float = 0.0
    #: This agent's own leaf Envoy, checked and used for background probes (None: ``cells[].leaf.address``).
    envoy_address: str | None = None
    #: A span per pick to an OTLP collector (off unless it names one).
    tracing: TracingOptions = field(default_factory=TracingOptions)
    #: That Envoy's admin ``host:port``: count healthy only the servers it routes to (None: off).
    envoy_admin: str | None = None


@dataclass
class _GatedAls:
    """The access-log socket's gate, the per-run directory behind it, and the private directory when it is
    DLB's own — made by this agent, or the default one in ``/tmp`` named after the probe address — which is
    removed at stop when empty (a mount point or a directory with anything else in it stays)."""

    gate: PeerGate
    inner: AgentSocketDir
    made_dir: Path | None

    def remove(self) -> None:
        self.inner.remove()
        if self.made_dir is not None:
            with contextlib.suppress(OSError):  # not empty (someone put a file there), or a mount point
                self.made_dir.rmdir()


def _bind_als(server: grpc.aio.Server, address: str, default: bool = False) -> _GatedAls | None:
    """Bind the access-log server. A Unix socket: its directory must be private (made 0700 if missing),
    a socket file left by a killed agent is replaced (a live one is not), and the server listens in a
    per-run directory behind a :class:`PeerGate` at ``address`` (returned, to start once it serves)."""
    gate = None
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        try:
            made = private_dir(Path(path).parent)
        except GateError as exc:
            raise BindError(address, str(exc)) from None
        if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # nobody listens there: stale
            else:
                raise BindError(address, "another process serves this access-log socket")
            finally:
                probe.close()
        inner = AgentSocketDir.in_private(Path(path))
        gate = _GatedAls(PeerGate(path, inner.grpc_socket), inner, Path(path).parent if made or default else None)
        address = f"unix:{inner.grpc_socket}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise BindError(address, "gRPC could not bind it (in use, or no such directory?)")
    return gate


async def run_leaf(cfg: Config, opts: LeafOptions) -> None:
    """Serve probes, the access log and (on ``opts.listen``) ext_proc on grpc.aio; with ``opts.ext_proc_h2``
    the ext_proc is served on that address by DLB's HTTP/2 transport instead (the request path).

    ``opts.envoy_address`` is this agent's own leaf Envoy, which it checks and sends background probes
    through (default ``cells[].leaf.address``). In a pod that is ``127.0.0.1:<port>``: the cell's
    address is then a load balancer in front of the pod, which could answer while this Envoy is dead.
    """
    cell_name = opts.cell
    lp = cfg.policy.leaf
    try:
        background = background_config(lp.background_probe)
    except ValueError as e:
        raise UsageError(f"dlb serve leaf: the background-probe plugin: {e}") from None
    state = state_from_config(cfg, cell_name, lp.pick_params.choices, opts.seed, lp.fit.refit_period_s, lp.fit.window_s,
                              pick_rule=lp.pick)
    agent = LeafAgent(state)
    agent.envoy_picks = cfg.cell(cell_name).leaf.ext_proc is None  # no leaf ext_proc: the leaf Envoy picks
    agent.access_log.known_sources = frozenset(cfg.cell_names)
    bg = agent.background
    bg.stopping = lambda: not health.serving  # serve_until_signal clears it at the stop signal
    sync = None
    if opts.xds:

        def background_from_policy(policy: LeafPolicy) -> None:
            # A prober setting the leaf refuses raises ValueError here: the update is NACKed, the old one stays.
            bg.set_background(background_config(policy.background_probe), background_body(policy.background_probe))
            bp = policy.background_probe
            log.info("leaf_background_probe", cell=cell_name, on=bg.bg_config is not None, max_tokens=bp.max_tokens,
                     model=bp.model or "", min_interval_ms=bp.min_interval_ms, max_interval_ms=bp.max_interval_ms)

        sync = LeafXdsSync(state, opts.xds, cell_name, delta=opts.xds_delta,
                           tls=component_identity(cfg.tls, "leaf", cell_name, cfg.source), on_policy=background_from_policy)
    server = grpc.aio.server(options=bounded_options(10_000))
    health = HealthState()
    tracer = make_tracer(opts.tracing)
    handle: MessageHandler = agent.handle
    if tracer is not None:
        from dlb.ext_proc.tracing import describe_leaf, traced

        handle = traced(agent.handle, tracer, "dlb.leaf.pick", describe_leaf(agent))
    server.add_generic_rpc_handlers((ext_proc_handler(handle), health_handler(health)))
    probe_pb2_grpc.add_ProbeServicer_to_server(agent.probe, server)
    # The access log gets a server of its own on a channel only the cell's Envoy reaches (docs/security.md);
    # it answers grpc.health.v1 too (Envoy health-checks its agent cluster there).
    als_server = grpc.aio.server(options=bounded_options(64))
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(agent.access_log, als_server)
    als_server.add_generic_rpc_handlers((health_handler(health),))
    leaf = cfg.cell(cell_name).leaf
    als_address = leaf.access_log_address()
    gated = _bind_als(als_server, als_address, default=not leaf.access_log)
    tls = component_identity(cfg.tls, "leaf", cell_name, cfg.source)
    ports = [add_port(server, addr, tls) for addr in opts.listen]
    h2 = None
    if opts.ext_proc_h2 is not None:
        h2 = ExtProcServer("h2", handle, health=health, tls=tls)  # NOT_SERVING with the rest of the leaf on drain
        ports.append(await h2.bind(opts.ext_proc_h2))
        agent.transport_stats = h2.stats
    metrics_port = None
    readiness = Readiness()  # /readyz: 200 once the gRPC server serves, 503 again from the drain's start
    loop_lag = LoopLag("dlb_leaf")
    if opts.metrics:
        host, _, mport = opts.metrics.rpartition(":")
        registry, metrics_port = serve_metrics(agent.collect, host.strip("[]") or "127.0.0.1", int(mport),
                                               lambda: readiness.ready and health.serving, prefix="dlb_leaf")
        registry.register(CallbackCollector(loop_lag.start().families))
        if tls is not None:
            registry.register(CallbackCollector(lambda: tls_live.COUNTS.families("dlb_leaf")))
    await server.start()
    await als_server.start()
    if gated is not None:
        try:
            await gated.gate.start()
        except GateError as exc:
            raise BindError(als_address, str(exc)) from None
        agent.als_gate = gated.gate
    readiness.ready = True
    if sync is not None:
        await sync.start()
    tasks = [asyncio.create_task(bg.fit_loop()), asyncio.create_task(agent.hold_loop())]
    envoy_address = opts.envoy_address or str(cfg.cell(cell_name).leaf.address)
    if opts.envoy_check_period_s > 0:
        bg.envoy_ok = False  # not ready for traffic until the first check finds the leaf Envoy up
        tasks.append(asyncio.create_task(bg.envoy_check_loop(envoy_address, opts.envoy_check_period_s)))
    if opts.envoy_admin is not None:
        # Twice per health-check period: the verdict reaches probes within a quarter second of Envoy acting on it.
        tasks.append(asyncio.create_task(bg.envoy_health_loop(opts.envoy_admin, SERVER_CHECK_INTERVAL_S / 2)))
    if opts.scrape_period_s > 0:
        tasks.append(asyncio.create_task(bg.scrape_loop(opts.scrape_period_s, min(1.0, max(0.2, opts.scrape_period_s)))))
    # Runs while probing is off too: a live config change (xDS) can turn it on without a restart.
    tasks.append(asyncio.create_task(bg.background_loop(envoy_address, background, background_body(lp.background_probe))))
    log.info("leaf_started", cell=cell_name, grpc_ports=ports, metrics_port=metrics_port, access_log=als_address,
             servers=[s.address for s in state.servers], choices=state.choices)
    if opts.ready_file:
        write_ready(opts.ready_file, {"grpc": ports[0], "grpc_ports": ports, "metrics": metrics_port, "pid": os.getpid()})

    async def on_stop() -> None:
        readiness.ready = False
        loop_lag.stop()
        for t in tasks:
            t.cancel()
        if sync is not None:
            await sync.stop()
        if h2 is not None:
            await h2.stop()
        if gated is not None:
            await gated.gate.stop()
        await als_server.stop(0.5)
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)  # the spans still buffered
        if gated is not None:
            gated.remove()
        log.info("leaf_stopping", cell=cell_name)

    # The drain is for this agent's leaf Envoy: it ends early once that Envoy is gone (the check loop's verdict).
    audience = (lambda: bg.envoy_ok) if opts.envoy_check_period_s > 0 else None
    await serve_until_signal(server, on_stop, health=health, drain_s=opts.drain_s, audience=audience)
