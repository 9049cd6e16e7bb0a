"""Running the EPP (``dlb serve epp``): one grpc.aio server carrying ext_proc, health and the probe service.

Why grpc.aio and not DLB's HTTP/2 transport: a GIE gateway sends the whole exchange and some messages
need two replies or none (per-stream state, :mod:`dlb.epp.picker`); the HTTP/2 transport's handler
answers each message with one reply and keeps no stream state.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from prometheus_client.metrics_core import Metric

from dlb.config import Config
from dlb.config.tls_live import component_identity
from dlb.epp.health import epp_health_handler
from dlb.epp.k8s import PoolRef, PoolWatcher
from dlb.epp.limits import GrpcLimits, StreamGate
from dlb.epp.metrics import epp_families
from dlb.epp.picker import EndpointPicker
from dlb.epp.pool import follow_dns, pool_names, with_pool
from dlb.ext_proc.leaf import LeafAgent
from dlb.ext_proc.leaf_setup import state_from_config
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.log import get_logger
from dlb.proto import probe_pb2_grpc
from dlb.service.health import HealthState
from dlb.service.loop_lag import LoopLag
from dlb.service.metrics import Readiness, serve_metrics
from dlb.service.ports import add_port
from dlb.service.runner import write_ready
from dlb.service.serve import serve_until_signal
from dlb.service.tracing import TracingOptions, make_tracer

log = get_logger("dlb.epp")


@dataclass(frozen=True)
class EppOptions:
    """How one EPP runs (process concerns; the pick rule and fit come from the config's ``policy``)."""

    cell: str
    #: gRPC ``host:port`` of ext_proc + health + probe.
    listen: str
    metrics: str | None = None
    ready_file: str | None = None
    scrape_period_s: float = 0.2
    seed: int | None = None
    #: Re-resolve the pool's DNS names this often (0: resolve once, at start).
    dns_period_s: float = 5.0
    shed_when_full: bool = False
    drain_s: float = 0.0
    #: After the drain, how long the streams in flight get to finish (each lasts its request's generation).
    grace_s: float = 600.0
    tracing: TracingOptions = field(default_factory=TracingOptions)
    #: Take the pool's endpoints from this InferencePool's ready pods instead of the cell's servers.
    pool: PoolRef | None = None
    kubeconfig: str | None = None
    limits: GrpcLimits = field(default_factory=GrpcLimits)


def ext_proc_handler(epp: EndpointPicker, agent: LeafAgent, gate: StreamGate, clock=time.monotonic) -> grpc.GenericRpcHandler:
    """ExternalProcessor.Process with one :class:`~dlb.epp.picker.EppStream` per call; its end releases the pick.
    Past ``gate.limit`` open streams a new one is refused (RESOURCE_EXHAUSTED: the gateway's ``failureMode`` applies)."""

    async def process(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if not gate.enter():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"dlb epp: {gate.limit} ext_proc streams open (--max-streams)")
        traceparent = None
        if epp.tracer is not None:  # Envoy's trace context of this ext_proc call, when its tracer is on
            traceparent = next((v for k, v in context.invocation_metadata() or () if k == "traceparent"), None)
        stream = epp.stream(traceparent if isinstance(traceparent, str) else None)
        try:
            async for raw in requests:
                t0 = time.perf_counter()
                replies = stream.on_message(ep.ProcessingRequest.FromString(raw), clock())
                agent.processing.observe(time.perf_counter() - t0)
                for reply in replies:
                    yield reply
        finally:
            gate.leave()
            stream.finish(clock(), aborted=True)  # nothing if the response already ended

    method = grpc.stream_stream_rpc_method_handler(process, request_deserializer=None, response_serializer=None)
    service, _, name = PROCESS_METHOD.strip("/").rpartition("/")
    return grpc.method_handlers_generic_handler(service, {name: method})


def set_pool(epp: EndpointPicker, endpoints: tuple[str, ...]) -> None:
    """Swap in a new endpoint set (on the event loop, between two picks); none ready: answer 503 until some are."""
    moved = bool(endpoints) and list(endpoints) != [s.address for s in epp.state.servers]
    if moved or epp.empty != (not endpoints):
        epp.pool_updates += 1
    epp.empty = not endpoints
    if moved:
        epp.state.set_servers([(a, 1.0) for a in endpoints])
    log.info("epp_pool_changed", endpoints=list(endpoints))


async def list_pool(opts: EppOptions) -> tuple[PoolWatcher, tuple[str, ...]]:
    """Read the InferencePool and list its pods once: a refusal ends the start. The watch starts later."""
    from dlb.epp.k8s import kube_client

    assert opts.pool is not None
    watcher = PoolWatcher(opts.pool, kube_client(opts.kubeconfig), publish=lambda eps: None)
    return watcher, await asyncio.to_thread(watcher.sync)


async def run_epp(cfg: Config, opts: EppOptions) -> None:
    """Serve the EPP for the pool of ``cfg``'s cell ``opts.cell`` until SIGTERM, then drain."""
    watcher = None
    if opts.pool is not None:  # the pool's ready pods are the cell's servers
        watcher, endpoints = await list_pool(opts)
        cfg = with_pool(cfg, opts.cell, endpoints)
    lp = cfg.policy.leaf
    state = state_from_config(cfg, opts.cell, lp.pick_params.choices, opts.seed, lp.fit.refit_period_s, lp.fit.window_s,
                              pick_rule=lp.pick)
    agent = LeafAgent(state)
    tracer = make_tracer(opts.tracing)
    epp = EndpointPicker(state, shed_when_full=opts.shed_when_full, tracer=tracer)
    health = HealthState()
    readiness = Readiness()
    server = opts.limits.server()
    gate = StreamGate(opts.limits.max_streams)
    server.add_generic_rpc_handlers((ext_proc_handler(epp, agent, gate), epp_health_handler(health, lambda: readiness.ready)))
    probe_pb2_grpc.add_ProbeServicer_to_server(agent.probe, server)
    port = add_port(server, opts.listen, component_identity(cfg.tls, "leaf", opts.cell, cfg.source))
    metrics_port = None
    dns = watcher is None and opts.dns_period_s > 0 and bool(pool_names(cfg, opts.cell))
    loop_lag = LoopLag("dlb_epp")
    if opts.metrics:
        host, _, mport = opts.metrics.rpartition(":")
        loop_lag.start()

        # The leaf's families (dlb_leaf_*: the EPP is the leaf behind GIE's protocol) and the EPP's own (dlb_epp_*).
        def collect() -> Iterator[Metric]:
            yield from agent.collect()
            yield from epp_families(epp, opts.limits, gate, watcher, dns=dns)
            yield from loop_lag.families()

        _, metrics_port = serve_metrics(collect, host.strip("[]") or "127.0.0.1", int(mport), lambda: readiness.ready and health.serving,
                                        prefix="dlb_epp")
    if watcher is not None:
        loop = asyncio.get_running_loop()
        watcher.publish = lambda eps: loop.call_soon_threadsafe(set_pool, epp, eps)  # from the watch thread onto the loop
        epp.empty = not watcher.last
    await server.start()
    readiness.ready = True
    bg = agent.background
    tasks = [asyncio.create_task(bg.fit_loop())]
    if opts.scrape_period_s > 0:
        tasks.append(asyncio.create_task(bg.scrape_loop(opts.scrape_period_s, min(1.0, max(0.2, opts.scrape_period_s)))))
    if watcher is not None:
        watcher.start()
    elif opts.dns_period_s > 0:
        def dns_changed() -> None:
            epp.pool_updates += 1

        tasks.append(asyncio.create_task(follow_dns(cfg, opts.cell, state, opts.dns_period_s, on_change=dns_changed)))
    log.info("epp_started", pool=opts.cell, grpc_port=port, metrics_port=metrics_port, endpoints=[s.address for s in state.servers],
             pick=state.pick_rule)
    if opts.ready_file:
        write_ready(opts.ready_file, {"grpc": port, "metrics": metrics_port, "pid": os.getpid()})

    async def on_stop() -> None:
        readiness.ready = False
        loop_lag.stop()
        for t in tasks:
            t.cancel()
        if watcher is not None:
            watcher.stop()
        if tracer is not None:
            await asyncio.to_thread(tracer.shutdown)  # flush the spans still buffered
        log.info("epp_stopping", pool=opts.cell)

    await serve_until_signal(server, on_stop, grace_s=opts.grace_s, health=health, drain_s=opts.drain_s)
