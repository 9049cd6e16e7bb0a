"""``dlb bench xds``: push-to-ACK latency and memory of one xDS server process with N streams.

The server runs in a child process (``python -m dlb.bench.xds_scale --serve``) so its RSS is measured
alone; the simulated clients (``dlb.xds.client.XdsClient``, one grpc.aio channel and ADS stream each,
subscribed to one RDS RouteConfiguration) run in ``--client-procs`` processes of their own (``--clients``
mode of this module; 0 = in this process, as before). Each round changes the route's weighted-cluster
weights (what the flow loop does), and the server records, per stream, the time from ``set_snapshot``
to the stream's ACK of that version. Latency includes the clients' work: on a 2-core machine they
share the CPU with the server wherever they run. ``--profile FILE`` writes the server's cProfile
statistics (where push→ACK time goes) when it stops. ``--server-gc control-plane`` (default) sets the
server's garbage collector as ``dlb control-plane`` does; ``python`` keeps the interpreter's defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf.message import Message

from dlb.bench import harness
from dlb.bench.xds_wire_client import WireClient
from dlb.gc_heap import freeze_heap, raise_young_threshold
from dlb.log import get_logger
from dlb.xds import types
from dlb.xds.cache import SnapshotCache
from dlb.xds.callbacks import NoCallbacks
from dlb.xds.client import Backoff, XdsClient
from dlb.xds.server import XdsServer
from dlb.xds.snapshot import Snapshot
from dlb.xds.status import StatusServer
from dlb.xds.testing import eds_cluster, node, route_config

log = get_logger("dlb.bench.xds_scale")
ROUTE_NAME = "bench-route"
CELLS = [f"cell-{i}" for i in range(8)]
#: Lean clients connecting at once (``--client-impl wire``); the next batch starts when these have their first update.
WIRE_CONNECTS = 256


def _route_snapshot(round_no: int) -> Snapshot:
    rng = np.random.default_rng(round_no)
    weights = {c: int(w) for c, w in zip(CELLS, rng.integers(1, 1000, len(CELLS)), strict=True)}
    return Snapshot.build([route_config(ROUTE_NAME, weights=weights)])


def _cluster_snapshot(round_no: int, count: int) -> Snapshot:
    """``count`` clusters; each round changes one of them (a cell's state moving, the rest steady)."""
    clusters = [eds_cluster(f"cluster-{i:05d}") for i in range(count)]
    clusters[round_no % count].connect_timeout.FromMilliseconds(1000 + round_no)
    return Snapshot.build(clusters, extra_types=[types.CLUSTER])


def _workload(resources: int) -> tuple[str, Callable[[int], Snapshot]]:
    """What the clients subscribe to: one RDS route (default) or a wildcard CDS of many clusters."""
    if resources <= 1:
        return types.ROUTE, _route_snapshot
    return types.CLUSTER, lambda round_no: _cluster_snapshot(round_no, resources)


def _subscription(resources: int) -> tuple[str, type[Message], list[str] | None]:
    """What each client subscribes to (type, message class, names; None: wildcard), for either kind of client."""
    if resources <= 1:
        return types.ROUTE, route_pb2.RouteConfiguration, [ROUTE_NAME]
    return types.CLUSTER, cluster_pb2.Cluster, None


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    return time.process_time()  # whole process (gRPC's threads too), ns resolution


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of another process (a client process), from ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- server side (child process) --------------------------------------------------------------

class _GcCpu:
    """CPU seconds the server's loop thread spent in garbage collection, and collections per generation.

    Thread CPU time, not wall time like ``dlb.gc_heap.GcPauses``: on a loaded box a collection that is
    descheduled midway counted the wait too (wall "GC time" above the process's whole CPU time).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = [0, 0, 0]
        self._started: float | None = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        elif self._started is not None:
            self.seconds += time.thread_time() - self._started
            self._started = None
            self.count[min(max(int(info.get("generation", 2)), 0), 2)] += 1


class _PushLatency(NoCallbacks):
    """Stream observer: milliseconds from ``set_snapshot`` to each response sent and each ACK, per version."""

    def __init__(self, cache: SnapshotCache, type_url: str) -> None:
        self.cache, self.type_url = cache, type_url
        self.acks: dict[str, list[float]] = {}
        self.sends: dict[str, list[float]] = {}

    def _record(self, into: dict[str, list[float]], type_url: str, version: str) -> None:
        t0 = self.cache.set_time(version)
        if type_url == self.type_url and t0 is not None:
            into.setdefault(version, []).append((time.monotonic() - t0) * 1000)

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        self._record(self.sends, type_url, version)

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        self._record(self.acks, type_url, version)


async def _serve(resources: int, gc_setup: str = "python", transport: str = "h2") -> None:
    type_url, build = _workload(resources)
    cache = SnapshotCache(node_key=lambda _n: "bench")
    latency = _PushLatency(cache, type_url)
    gc_cpu = _GcCpu()  # garbage collection's share of the server's CPU
    server = XdsServer(cache, callbacks=[latency], transport=transport)
    acks, sends = latency.acks, latency.sends
    round_no = 0
    build_cpu = [0.0]
    cache.set_snapshot("bench", build(round_no))

    async def update(_req: web.Request) -> web.Response:
        nonlocal round_no
        round_no += 1
        before = _cpu_s()
        snap = build(round_no)  # building the snapshot is the caller's cost, not the server's
        build_cpu[0] += _cpu_s() - before
        version = cache.set_snapshot("bench", snap)
        return web.json_response({"version": version})

    async def ack_latencies(req: web.Request) -> web.Response:
        v = req.query["version"]
        if "count" in req.query:  # polling while ACKs come in: encoding 5,000 floats per poll cost the server seconds
            return web.json_response({"acks": len(acks.get(v, []))})
        return web.json_response({"latencies_ms": acks.get(v, []), "sent_ms": sends.get(v, [])})

    async def current(_req: web.Request) -> web.Response:
        snap = cache.get_snapshot("bench")
        return web.json_response({"version": snap.version if snap is not None else None})

    async def rss(_req: web.Request) -> web.Response:
        return web.json_response({"rss_mb": _rss_mb(), "cpu_s": _cpu_s() - build_cpu[0], "gc_s": gc_cpu.seconds,
                                  "gc_count": gc_cpu.count, "watches": cache.watch_count,
                                  "body_cache_hits": server.ctx.body_cache.hits, "h2": server.transport_stats()})

    status = StatusServer(server.status, extra_routes=[web.post("/bench/update", update),
                                                       web.get("/bench/acks", ack_latencies), web.get("/bench/rss", rss),
                                                       web.get("/bench/version", current)])
    xds_port = await server.start()
    http_port = await status.start()
    if gc_setup == "control-plane":  # what dlb control-plane does once it serves (dlb/gc_heap.py)
        freeze_heap()
        raise_young_threshold()
    print(json.dumps({"xds_port": xds_port, "http_port": http_port}), flush=True)
    try:
        await asyncio.Event().wait()  # until the parent terminates us
    finally:
        await status.stop()
        await server.stop(None)


# --- client side ------------------------------------------------------------------------------

@dataclass
class _ServerProc:
    proc: subprocess.Popen
    xds_port: int
    http_port: int

    def call(self, path: str, method: str = "GET") -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())


def _start_server(uvloop: bool, resources: int, profile: str | None = None, gc_setup: str = "python",
                  transport: str = "h2") -> _ServerProc:
    cmd = [sys.executable, "-m", "dlb.bench.xds_scale", "--serve", str(resources), "--gc", gc_setup, "--transport", transport]
    cmd += ["--uvloop"] if uvloop else []
    cmd += ["--profile", profile] if profile else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            env={**os.environ, "DLB_LOG_LEVEL": "WARNING"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"bench xDS server exited with {proc.returncode}")
    ports = json.loads(line)
    return _ServerProc(proc, ports["xds_port"], ports["http_port"])


async def _until(cond, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _clients(address: str, first: int, count: int, delta: bool, resources: int,
             shared: bool = False) -> tuple[list[XdsClient], list[Any]]:
    """``count`` clients, node ids ``bench-<first+i>``, each subscribed to the workload's resources.

    Each on a TCP connection of its own, as every Envoy is (``shared``: gRPC's default, one connection
    for all channels of the process to the same address, as the benchmark ran before).
    """
    options = None if shared else [("grpc.use_local_subchannel_pool", 1)]
    clients = [XdsClient(address, node(f"bench-{first + i}", "bench"), backoff=Backoff(initial=0.2, maximum=2.0), delta=delta,
                         channel_options=options)
               for i in range(count)]
    type_url, cls, names = _subscription(resources)
    subs = [c.subscribe(type_url, cls, lambda _r: None, names=names) for c in clients]
    return clients, subs


def _start_client_procs(srv: _ServerProc, streams: int, procs: int, delta: bool, resources: int,
                        shared: bool = False, impl: str = "grpc") -> list[subprocess.Popen]:
    """The clients in ``procs`` processes of their own (``--clients`` mode), streams split evenly."""
    out = []
    for k in range(procs):
        first, count = k * streams // procs, (k + 1) * streams // procs - k * streams // procs
        if count:
            out.append(subprocess.Popen([sys.executable, "-m", "dlb.bench.xds_scale", "--clients", f"127.0.0.1:{srv.xds_port}",
                                         str(first), str(count), str(resources)] + (["--delta"] if delta else [])
                                        + (["--shared"] if shared else []) + ["--impl", impl],
                                        env={**os.environ, "DLB_LOG_LEVEL": "WARNING"}))
    return out


async def _measure(srv: _ServerProc, streams: int, updates: int, timeout: float, delta: bool, resources: int,
                   client_procs: int = 0, shared: bool = False, impl: str = "grpc") -> dict:
    loop = asyncio.get_running_loop()
    call = lambda path, method="GET": loop.run_in_executor(None, srv.call, path, method)
    clients: list[XdsClient] = []
    subs: list[Any] = []
    procs: list[subprocess.Popen] = []

    async def acked(version: str) -> int:
        return int((await call(f"/bench/acks?version={version}&count=1"))["acks"])

    try:
        if client_procs:
            procs = _start_client_procs(srv, streams, client_procs, delta, resources, shared, impl)
            v0 = (await call("/bench/version"))["version"]
            deadline = time.monotonic() + timeout
            while await acked(v0) < streams:  # ACKs of a version counted by the server, whoever sent them
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise TimeoutError(f"bench: {streams} initial ACKs not in after {timeout}s (or a client process exited)")
                await asyncio.sleep(0.1)
        else:
            clients, subs = _clients(f"127.0.0.1:{srv.xds_port}", 0, streams, delta, resources, shared)
            for c in clients:
                await c.start()
            await _until(lambda: all(s.version for s in subs), f"{streams} initial ACKs", timeout)
        proc0 = await call("/bench/rss")
        clients0 = sum(_proc_cpu_s(p.pid) for p in procs)
        rss_mb = proc0["rss_mb"]
        latencies: list[float] = []
        fanout: list[float] = []
        for _ in range(updates):
            version = (await call("/bench/update", "POST"))["version"]
            if not procs:
                await _until(lambda: all(s.version == version for s in subs), f"{streams} clients at {version}", timeout)  # noqa: B023 - called within this iteration
            deadline = time.monotonic() + timeout
            while (n := await acked(version)) < streams:  # the last ACKs may still be in flight to the server
                if time.monotonic() > deadline:
                    raise TimeoutError(f"bench: {n} of {streams} ACKs of {version} after {timeout}s")
                await asyncio.sleep(0.01 if not procs else 0.05)
            got = await call(f"/bench/acks?version={version}")
            latencies += got["latencies_ms"]
            fanout.append(max(got["sent_ms"]))
        proc1 = await call("/bench/rss")
        cpu_s = proc1["cpu_s"] - proc0["cpu_s"]
        client_cpu_s = sum(_proc_cpu_s(p.pid) for p in procs) - clients0
    finally:
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    lat = np.array(latencies)
    return {"streams": streams, "updates": updates, "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3), "max_ms": round(float(lat.max()), 3),
            # server alone: time from set_snapshot until the response was handed to the last stream
            "fanout_ms": round(float(np.median(fanout)), 3),
            # server CPU per delivered update (push + ACK), robust to a busy machine unlike wall time
            "server_cpu_us_per_update": round(cpu_s * 1e6 / (streams * updates), 1),
            # the client processes' CPU per delivered update (decode + ACK): on one box, it competes with the server
            "client_cpu_us_per_update": round(client_cpu_s * 1e6 / (streams * updates), 1) if procs else None,
            # of which garbage collection (thread CPU), and the collections per generation (young, middle, full)
            "server_gc_us_per_update": round((proc1["gc_s"] - proc0["gc_s"]) * 1e6 / (streams * updates), 1),
            "server_gc_collections": [b - a for a, b in zip(proc0["gc_count"], proc1["gc_count"], strict=True)],
            "rss_mb": round(rss_mb, 2)}


async def run_bench(stream_counts: list[int], updates: int = 5, timeout: float = 120.0,
                    uvloop: bool = False, delta: bool = False, resources: int = 1, client_procs: int = 0,
                    profile: str | None = None, server_gc: str = "control-plane", transport: str = "h2",
                    shared: bool = False, impl: str = "grpc") -> list[dict]:
    srv = _start_server(uvloop, resources, profile, server_gc, transport)
    try:
        loop = asyncio.get_running_loop()
        base = (await loop.run_in_executor(None, srv.call, "/bench/rss"))["rss_mb"]
        records = []
        for n in stream_counts:
            rec = await _measure(srv, n, updates, timeout, delta, resources, client_procs, shared, impl)
            rec["rss_base_mb"] = round(base, 2)
            rec["rss_per_stream_kb"] = round((rec["rss_mb"] - base) * 1024 / n, 2)
            rec["clients_in_one_process"] = client_procs == 0
            rec["client_processes"] = client_procs
            rec["server_loop"] = "uvloop" if uvloop else "asyncio"
            rec["server_gc"] = server_gc
            rec["transport"] = transport
            rec["connections"] = "shared" if shared else "per-client"
            rec["client_impl"] = impl
            rec["protocol"] = "delta" if delta else "sotw"
            rec["resources"] = resources
            log.info("xds_bench_point", **rec)
            records.append(rec)
        return records
    finally:
        srv.proc.terminate()
        try:
            srv.proc.wait(10)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait(10)


def run(args: argparse.Namespace) -> int:
    try:
        counts = [int(x) for x in args.streams.split(",") if x.strip()]
    except ValueError:
        print(f"--streams: {args.streams!r} is not a comma-separated list of integers", file=sys.stderr)
        return 2
    if not counts or min(counts) < 1 or args.updates < 1 or args.resources < 1:
        print("--streams needs positive counts, --updates and --resources >= 1", file=sys.stderr)
        return 2
    if args.client_impl == "wire" and (args.delta or args.client_procs < 1 or args.connections == "shared"):
        print("--client-impl wire: SotW clients in their own processes on a connection each "
              "(not with --delta, --client-procs 0 or --connections shared)", file=sys.stderr)
        return 2
    record = harness.start()
    records = asyncio.run(run_bench(counts, args.updates, args.timeout, args.uvloop, args.delta, args.resources,
                                    args.client_procs, args.profile, args.server_gc, args.transport,
                                    args.connections == "shared", args.client_impl))
    print(json.dumps(records, indent=1))
    return harness.finish(record, records, json_path=args.json)


async def _run_clients(address: str, first: int, count: int, resources: int, delta: bool, shared: bool,
                       impl: str = "grpc") -> None:
    """A client process: its streams stay up, ACKing every push, until SIGTERM."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if impl == "wire":
        await _run_wire_clients(address, first, count, resources, stop)
        return
    clients, _ = _clients(address, first, count, delta, resources, shared)
    for c in clients:
        await c.start()
    try:
        await stop.wait()
    finally:
        await asyncio.gather(*(c.stop() for c in clients), return_exceptions=True)


async def _run_wire_clients(address: str, first: int, count: int, resources: int, stop: asyncio.Event) -> None:
    """``count`` lean HTTP/2 clients (:mod:`dlb.bench.xds_wire_client`), connected at most
    ``WIRE_CONNECTS`` at a time so the connect storm does not starve the server's accept loop."""
    host, port = address.rsplit(":", 1)
    type_url, cls, names = _subscription(resources)
    clients = [WireClient(host, int(port), node(f"bench-{first + i}", "bench"), type_url, names or [], cls)
               for i in range(count)]
    tasks = []
    for k in range(0, count, WIRE_CONNECTS):
        batch = clients[k:k + WIRE_CONNECTS]
        tasks += [asyncio.create_task(c.run()) for c in batch]
        ready = asyncio.ensure_future(asyncio.gather(*(c.first_update.wait() for c in batch)))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((ready, stopped), return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        stopped.cancel()
        if stop.is_set():
            break
    try:
        await stop.wait()
    finally:
        for c in clients:
            c.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        lost = sum(c.reconnects for c in clients)
        if lost:
            log.warning("xds_bench_client_reconnects", reconnects=lost, clients=count)


def _profiled(main: Coroutine[Any, Any, None], path: str | None) -> None:
    """Run ``main``; with ``path``, under cProfile, the statistics written there when it ends (SIGTERM too)."""
    if path is None:
        asyncio.run(main)
        return
    import cProfile

    prof = cProfile.Profile()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM unwinds like Ctrl-C: the stats get written
    prof.enable()
    try:
        asyncio.run(main)
    finally:
        prof.disable()
        prof.dump_stats(path)


def serve_main(argv: list[str]) -> int:
    """The benchmark's processes: ``--serve RESOURCES [--gc control-plane|python] [--transport h2|grpc] [--uvloop]
    [--profile FILE]`` (the server) or
    ``--clients ADDRESS FIRST COUNT RESOURCES [--delta] [--shared]`` (a client process)."""
    from dlb import log as _log

    if argv[:1] == ["--clients"]:
        _log.configure()
        impl = argv[argv.index("--impl") + 1] if "--impl" in argv else "grpc"
        asyncio.run(_run_clients(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), "--delta" in argv, "--shared" in argv,
                                 impl))
        return 0
    if argv[:1] != ["--serve"]:
        print("usage: dlb bench xds (this module's --serve / --clients are the benchmark's own processes)", file=sys.stderr)
        return 1
    _log.configure()
    if "--uvloop" in argv:
        import uvloop

        uvloop.install()
    profile = argv[argv.index("--profile") + 1] if "--profile" in argv else None
    try:
        _profiled(_serve(int(argv[1]), argv[argv.index("--gc") + 1] if "--gc" in argv else "python",
                         argv[argv.index("--transport") + 1] if "--transport" in argv else "h2"), profile)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
