"""``dlb bench overhead``: what the Python hops cost, through real Envoys, measured in one run.

Three systems under test share one upstream (an Envoy ``direct_response`` listener, so the upstream
costs the same and almost nothing):

- ``plain``: the root Envoy as rendered by :func:`dlb.envoy.bootstrap.root_bootstrap` minus the
  ext_proc filter (requests take the fail-open weighted route) → upstream.
- ``root``: the same root Envoy with its ext_proc filter → ``dlb serve root`` → upstream.
- ``root+leaf``: root Envoy + root ext_proc → leaf Envoy + leaf ext_proc/ALS (``dlb serve leaf``) →
  upstream.
- ``root-native`` (extra): a root Envoy that knows only a live control plane's address; the flow
  endpoint's ``weighted_clusters`` (the control plane's flow loop) route it, no ext_proc on the request.

For each, a closed loop (``--connections`` workers) finds the saturation throughput, then an open
loop at half of the *root* configuration's saturation rate (the same rate for all three, so latencies
compare at equal load) gives p50/p99. The configurations are interleaved in ``--slices`` short runs
whose samples are pooled, so drifting background load (a shared CI box) hits them all alike. CPU per 1000 requests sums user+system time of the processes on
the request path (Envoys and DLB services; not the load generator, not the upstream), read from
/proc before and after each run. The load generator (:mod:`dlb.bench.loadgen`) runs in this
process; on a 2-core machine it competes for CPU with the system under test equally in all runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dlb.bench import harness
from dlb.bench import overhead_stats as stats
from dlb.bench.loadgen import LoadResult, build_request, closed_loop, open_loop
from dlb.bench.overhead_stats import AA_SUFFIX, FLOOR
from dlb.bench.wrk import run_wrk, wrk_binary
from dlb.config import config_from_dict
from dlb.envoy.binary import EnvoyProcess
from dlb.errors import DlbError
from dlb.log import get_logger
from dlb.service.tracing import otlp_unavailable
from dlb.testbed.process import ServiceProcess, free_port

log = get_logger("dlb.bench.overhead")

CONFIGS = ("plain", "root", "root+leaf")
#: Extra configuration for the leaf's measurement choice: the leaf ext_proc also processes response
#: headers (the alternative to the access log for completions). Not in the default set.
RESP_CONFIG = "root+leaf-resp"
#: The leaf without its ext_proc: Envoy LEAST_REQUEST picks, the agent measures from the access log.
LR_CONFIG = "root+leaf-lr"
#: The root service with two worker processes (SO_REUSEPORT) instead of one.
W2_CONFIG = "root-2w"
#: The floor: the same Envoy ext_proc hop to a bare grpc.aio servicer with a constant reply (no routing).
BARE_CONFIG = "root-bare"
#: The root service on grpc.aio (``--transport grpc``) instead of DLB's HTTP/2 server.
GRPC_CONFIG = "root-grpc"
#: Flow routing natively: a root Envoy configured entirely over ADS by a live control plane (its flow
#: loop probing the leaf agent), the flow endpoint's ``weighted_clusters`` route with ext_proc off.
NATIVE_CONFIG = "root-native"
#: Diagnostic variants of ``root-native``, to tell apart what its gap to ``plain`` costs: the control
#: plane in a thread of the bench process (sharing its CPU and GIL with the Python load generator),
#: and a root that also has a discrete endpoint, so its ext_proc filter stays in the chain, disabled
#: on the flow route (the shape every native root had before the filter was left out).
NATIVE_INPROC_CONFIG = "root-native-inproc"
NATIVE_MIXED_CONFIG = "root-native-mixed"
#: The discrete mechanism in Envoy (``native-discrete``): least-request over the cell's leaf, EDS
#: weights refreshed by a live control plane from probes; no ext_proc on the request.
NATIVE_DISCRETE_CONFIG = "root-native-discrete"
NATIVE_CONFIGS = (NATIVE_CONFIG, NATIVE_INPROC_CONFIG, NATIVE_MIXED_CONFIG, NATIVE_DISCRETE_CONFIG)
#: The floor of DLB's own transport: the constant reply served by :mod:`dlb.transport.h2`.
BARE_H2_CONFIG = "root-bare-h2"
#: The root hop under mutual TLS (the config's ``tls``, a throw-away CA): the root Envoy reaches the
#: root service over mTLS (TLS inside DLB's HTTP/2 transport), the root probes an mTLS leaf agent.
MTLS_CONFIG = "root-mtls"
#: The root hop with tracing on as an operator runs it: the root Envoy's OpenTelemetry tracer and the root
#: service's decision spans, both sampling ``TRACE_RATIO`` and exporting to a real OTLP collector. Judged
#: against ``root`` in the same slices (``TRACED_CPU_TARGET``), not against the floor.
TRACED_CONFIG = "root-traced"
TRACE_RATIO = 0.01
#: Tracing at 1 % sampling may add at most 5 % CPU per request to the root hop (Envoy + root service).
TRACED_CPU_TARGET = 1.05
EXTRA_CONFIGS = (RESP_CONFIG, LR_CONFIG, W2_CONFIG, BARE_CONFIG, BARE_H2_CONFIG, GRPC_CONFIG, MTLS_CONFIG, TRACED_CONFIG,
                 *NATIVE_CONFIGS)


def _cpu_of(pid: int) -> float:
    """CPU seconds of one process (all its threads): the scheduler's nanosecond run time from
    /proc/PID/task/*/schedstat, else user + system from /proc/PID/stat (10 ms ticks: too coarse for
    a one-second slice at a few hundred µs per request)."""
    try:
        total_ns = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total_ns += int((task / "schedstat").read_text().split()[0])
        return total_ns / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def _upstream_bootstrap(port: int, admin: int) -> dict[str, Any]:
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "upstream",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {"listeners": [{"name": "upstream", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                                            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}]}]},
    }


def _point_cluster(boot: dict[str, Any], cluster: str, port: int) -> None:
    for c in boot["static_resources"]["clusters"]:
        if c["name"] == cluster:
            c["type"] = "STATIC"
            c["load_assignment"] = {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}


def _strip_ext_proc(boot: dict[str, Any]) -> None:
    for listener in boot["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                hcm = f["typed_config"]
                hcm["http_filters"] = [h for h in hcm["http_filters"] if h["name"] != "envoy.filters.http.ext_proc"]
                for vh in hcm["route_config"]["virtual_hosts"]:
                    for r in vh["routes"]:
                        r.pop("typed_per_filter_config", None)


def _leaf_response_processing(boot: dict[str, Any]) -> None:
    """Make the leaf ext_proc see response headers too (a second round trip per request)."""
    for listener in boot["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for h in f["typed_config"]["http_filters"]:
                    if h["name"] == "envoy.filters.http.ext_proc":
                        h["typed_config"]["processing_mode"]["response_header_mode"] = "SEND"


def bench_config(upstream: int) -> dict[str, Any]:
    return {
        "version": 1,
        "cells": [{
            "name": "x",
            "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"},
            "root": {"address": f"127.0.0.1:{free_port()}", "ext_proc": f"127.0.0.1:{free_port()}"},
            "servers": [f"127.0.0.1:{upstream}"],
        }],
        "network": {"default_one_way_ms": 0},
        "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}, "policy": {"mechanism": "discrete", "cost": "latency"}}],
    }


def _record(config: str, mode: str, rate: float | None, res: LoadResult, cpu: dict[str, float], connections: int | None,
            loadgen: str = "python") -> dict[str, Any]:
    n = len(res.latencies_s)
    cpu_s = sum(v for k, v in cpu.items() if k != "loadgen")
    return {
        "config": config, "mode": mode, "rate": rate,
        "p50_ms": round(res.pct_ms(50), 4), "p99_ms": round(res.pct_ms(99), 4), "rps": round(res.rps, 1),
        "cpu_s_per_1k": round(cpu_s / n * 1000, 5) if n else None,
        "requests": n, "errors": res.errors, "dropped": res.dropped, "duration_s": round(res.duration_s, 3), "connections": connections,
        # Where the CPU went (ms per request) and how busy the machine was: context for the numbers.
        "cpu_ms_per_req": {k: round(v / n * 1000, 4) for k, v in cpu.items()} if n else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "loadgen": loadgen,
    }


BODY = b'{"model":"m","messages":[]}'
PATH = "/v1/chat/completions"
#: Connections wrk spreads the open-loop arrivals over (each waits an exponential think time).
WRK_OPEN_CONNECTIONS = 64


async def _measure(target: tuple[int, dict[str, int]], mode: str, *, connections: int, rate: float | None,
                   duration_s: float, loadgen: str = "python") -> tuple[LoadResult, dict[str, float]]:
    port, pids = target
    if loadgen == "python":  # the generator runs in this process: its CPU is ours
        pids = dict(pids, loadgen=os.getpid())
    cpu0 = {k: _cpu_of(pid) for k, pid in pids.items()}
    wrk_cpu = None
    if loadgen == "wrk":
        res, wrk_cpu = await run_wrk("127.0.0.1", port, PATH, BODY, connections if mode == "closed" else WRK_OPEN_CONNECTIONS,
                                     duration_s, rate if mode == "open" else None)
    elif mode == "closed":
        res = await closed_loop("127.0.0.1", port, build_request("127.0.0.1", port, PATH, BODY), connections, duration_s)
    else:
        assert rate is not None
        res = await open_loop("127.0.0.1", port, build_request("127.0.0.1", port, PATH, BODY), rate, duration_s)
    cpu = {k: _cpu_of(pid) - cpu0[k] for k, pid in pids.items()}
    if wrk_cpu is not None:
        cpu["loadgen"] = wrk_cpu
    return res, cpu


def _slice_json(res: LoadResult, cpu: dict[str, float]) -> dict[str, Any]:
    """One slice of one configuration: what the per-slice ratios to the floor are computed from."""
    return {"cpu_s": round(sum(v for k, v in cpu.items() if k != "loadgen"), 6), "requests": len(res.latencies_s),
            "p50_ms": round(res.pct_ms(50), 4) if len(res.latencies_s) else None}


def _pool(parts: list[tuple[LoadResult, dict[str, float]]]) -> tuple[LoadResult, dict[str, float]]:
    """Merge slices of one configuration into one result (latencies pooled, counts and CPU summed)."""
    statuses: dict[int, int] = {}
    cpu: dict[str, float] = {}
    for res, c in parts:
        for k, v in res.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
        for name, secs in c.items():
            cpu[name] = cpu.get(name, 0.0) + secs
    res = LoadResult(np.concatenate([r.latencies_s for r, _ in parts]), sum(r.errors for r, _ in parts),
                     sum(r.duration_s for r, _ in parts), statuses, sum(r.dropped for r, _ in parts))
    return res, cpu


def resolve_loadgen(choice: str) -> str:
    """``auto`` = wrk when installed (a C client: a few µs of CPU per request), else the Python one."""
    if choice == "auto":
        return "wrk" if wrk_binary() else "python"
    if choice == "wrk" and not wrk_binary():
        raise DlbError("dlb bench overhead: --loadgen wrk but wrk is not installed (apt-get install wrk, or set DLB_WRK)")
    return choice


def native_config(raw: dict[str, Any], upstream: int, listen: int, discrete_too: bool = False,
                  native_discrete: bool = False) -> dict[str, Any]:
    """``raw`` with its endpoint on flow routing, the cell's leaf address on the upstream (the control
    plane's EDS for ``cell-x``) and the root listener on ``listen``; the probe address is the leaf agent's.
    ``discrete_too`` adds a discrete endpoint the load never hits (its prefix), which keeps the root's
    ext_proc filter in the chain; ``native_discrete`` makes the endpoint ``native-discrete`` instead of flow."""
    cell = dict(raw["cells"][0])
    cell["leaf"] = dict(cell["leaf"], address=f"127.0.0.1:{upstream}")
    cell["root"] = dict(cell["root"], address=f"127.0.0.1:{listen}")
    cell["servers"] = [f"127.0.0.1:{free_port()}"]  # the leaf's; unused here (the upstream stands in for the leaf)
    ep = dict(raw["endpoints"][0], policy={"plugins": [{"type": "native-discrete", "parameters": {"cost": "latency"}}]}
              if native_discrete else {"mechanism": "flow", "cost": "latency"})
    extra = [dict(raw["endpoints"][0], name="unused-discrete", match={"prefix": "/unused/"})] if discrete_too else []
    return dict(raw, cells=[cell], endpoints=[*extra, ep])


class _ThreadedControlPlane:
    """``dlb serve control-plane``'s service on its own event loop in a thread (off the request path)."""

    def __init__(self, cfg: Any) -> None:
        import threading

        self._loop = asyncio.new_event_loop()
        self._cp: Any = None
        self.xds_port = 0
        self._error: BaseException | None = None
        started = threading.Event()

        def run() -> None:
            from dlb.control_plane.service import ControlPlane

            asyncio.set_event_loop(self._loop)
            try:
                self._cp = ControlPlane(cfg)
                self.xds_port, _ = self._loop.run_until_complete(self._cp.start("127.0.0.1:0", "127.0.0.1:0"))
            except BaseException as e:  # reported to the caller below
                self._error = e
                started.set()
                return
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="control-plane", daemon=True)
        self._thread.start()
        if not started.wait(30) or self._error is not None:
            raise RuntimeError(f"control plane did not start: {self._error}")

    def stop(self) -> None:
        if self._cp is not None:
            asyncio.run_coroutine_threadsafe(self._cp.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _wait_http(port: int, timeout_s: float = 30.0) -> None:
    """Until an Envoy configured over ADS has its listener and route (a 200 through it)."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no 200 through the ADS-configured root Envoy on port {port} after {timeout_s}s")
        time.sleep(0.1)


def run_overhead(duration_s: float, connections: int, configs: tuple[str, ...] = CONFIGS, slices: int = 1,
                 loadgen: str = "python", envoy_concurrency: int = 1, trace_ratio: float = TRACE_RATIO) -> list[dict[str, Any]]:
    from dlb.envoy.bootstrap import leaf_bootstrap, root_bootstrap, write_bootstrap

    tmp = tempfile.TemporaryDirectory(prefix="dlb-bench-overhead-")
    d = Path(tmp.name)
    records: list[dict[str, Any]] = []
    envoys: list[EnvoyProcess] = []
    services: list[ServiceProcess] = []
    bare_procs: list[subprocess.Popen] = []
    control_planes: list[_ThreadedControlPlane] = []
    collector: Any = None

    def envoy(boot: dict[str, Any], name: str, admin: int) -> EnvoyProcess:
        # The upstream stands in for the servers and stays at one worker; the Envoys under test get
        # ``envoy_concurrency`` workers each.
        e = EnvoyProcess(write_bootstrap(boot, d / f"{name}.yaml"), admin, base_id=random.randrange(1, 60000),
                         concurrency=1 if name == "upstream" else envoy_concurrency)
        envoys.append(e)
        return e.start()

    try:
        up_port, up_admin = free_port(), free_port()
        envoy(_upstream_bootstrap(up_port, up_admin), "upstream", up_admin)
        raw = bench_config(up_port)
        cfg_path = d / "dlb.yaml"
        cfg_path.write_text(json.dumps(raw))
        cfg = config_from_dict(raw, source=str(cfg_path))
        root_svc = ServiceProcess("root", "--config", str(cfg_path), "--cell", "x", "--metrics", f"127.0.0.1:{free_port()}")
        leaf_svc = ServiceProcess("leaf", "--config", str(cfg_path), "--cell", "x", "--metrics", f"127.0.0.1:{free_port()}",
                                  "--scrape-period-ms", "0", "--envoy-check-period-ms", "0")
        services += [root_svc, leaf_svc]
        grpc_port = free_port()
        if GRPC_CONFIG in configs:
            root_grpc = ServiceProcess("root", "--config", str(cfg_path), "--cell", "x", "--listen", f"127.0.0.1:{grpc_port}",
                                       "--metrics", "", "--transport", "grpc")
            services.append(root_grpc)
        w2_port = free_port()
        if W2_CONFIG in configs:
            root_w2 = ServiceProcess("root", "--config", str(cfg_path), "--cell", "x", "--listen", f"127.0.0.1:{w2_port}",
                                     "--metrics", "", "--workers", "2")
            services.append(root_w2)
        traced_port = free_port()
        if TRACED_CONFIG in configs:
            reason = otlp_unavailable()
            if reason is not None:
                raise DlbError(f"dlb bench overhead --configs {TRACED_CONFIG}: {reason}")
            from dlb.testbed.otlp_collector import Collector

            collector = Collector(keep=False)
            otlp_port = collector.start()
            root_traced = ServiceProcess("root", "--config", str(cfg_path), "--cell", "x", "--listen", f"127.0.0.1:{traced_port}",
                                         "--metrics", "", "--otlp-endpoint", f"127.0.0.1:{otlp_port}",
                                         "--trace-sample-ratio", str(trace_ratio))
            services.append(root_traced)
        if MTLS_CONFIG in configs:
            from dlb.testbed.pki import dlb_pki

            pki, _ = dlb_pki(d / "pki", ("x",))
            raw_tls = bench_config(up_port)  # its own ports
            raw_tls["tls"] = {"ca": pki.ca, "cert": pki.cert, "key": pki.key}
            raw_tls["cells"][0]["leaf"]["access_log"] = f"unix:{d / 'als-mtls.sock'}"  # not the plain leaf's socket
            tls_path = d / "dlb-mtls.yaml"
            tls_path.write_text(json.dumps(raw_tls))
            cfg_tls = config_from_dict(raw_tls, source=str(tls_path))
            root_tls = ServiceProcess("root", "--config", str(tls_path), "--cell", "x", "--metrics", "")
            services += [root_tls, ServiceProcess("leaf", "--config", str(tls_path), "--cell", "x", "--metrics", "",
                                                  "--scrape-period-ms", "0", "--envoy-check-period-ms", "0")]
        for s in services:
            s.spawn()
        for s in services:
            s.wait_ready()
        targets: dict[str, tuple[int, dict[str, int]]] = {}

        def root_to_upstream(name: str, ext_proc_port: int | None = None, strip: bool = False) -> tuple[int, int]:
            """A root Envoy straight to the upstream, its ext_proc at ``ext_proc_port`` (default: the
            config's root service); ``strip`` removes the filter (plain). Returns (port, Envoy pid)."""
            p, a = free_port(), free_port()
            b = root_bootstrap(cfg, "x", admin_port=a, listen=_hp(p), ext_proc=_hp(ext_proc_port) if ext_proc_port else None)
            if strip:
                _strip_ext_proc(b)
            _point_cluster(b, "cell-x", up_port)
            return p, envoy(b, name, a).pid

        if "plain" in configs:
            p, pid = root_to_upstream("plain", strip=True)
            targets["plain"] = (p, {"root_envoy": pid})
        if "root" in configs:
            p, pid = root_to_upstream("root")
            targets["root"] = (p, {"root_envoy": pid, "root_ext_proc": root_svc.pid})
        if "root+leaf" in configs:
            p, a = free_port(), free_port()
            b = root_bootstrap(cfg, "x", admin_port=a, listen=_hp(p))
            la = free_port()
            lb = leaf_bootstrap(cfg, "x", admin_port=la, emulate_wan=False, access_log=True)
            leaf_env = envoy(lb, "leaf", la)
            targets["root+leaf"] = (p, {"root_envoy": envoy(b, "root-leaf", a).pid, "root_ext_proc": root_svc.pid,
                                        "leaf_envoy": leaf_env.pid, "leaf_agent": leaf_svc.pid})
        for bare_name, transport in ((BARE_CONFIG, "grpc"), (BARE_H2_CONFIG, "h2")):
            if bare_name not in configs:
                continue
            bare_port = free_port()
            ready = d / f"{bare_name}.json"
            bare = subprocess.Popen([sys.executable, "-m", "dlb.bench.bare", "--listen", f"127.0.0.1:{bare_port}",
                                     "--cell", "cell-x", "--transport", transport, "--ready-file", str(ready)])
            bare_procs.append(bare)
            while not ready.exists():
                if bare.poll() is not None:
                    raise RuntimeError("bare ext_proc exited")
                time.sleep(0.05)
            p, pid = root_to_upstream(bare_name, bare_port)
            targets[bare_name] = (p, {"root_envoy": pid, "root_ext_proc": bare.pid})
        for native_name in (n for n in NATIVE_CONFIGS if n in configs):
            from dlb.envoy.ads_bootstrap import ads_bootstrap
            from dlb.envoy.root_token import token_secret

            p, a = free_port(), free_port()
            native_raw = native_config(raw, up_port, p, discrete_too=native_name == NATIVE_MIXED_CONFIG,
                                       native_discrete=native_name == NATIVE_DISCRETE_CONFIG)
            native_path = d / f"dlb-{native_name}.yaml"
            native_path.write_text(json.dumps(native_raw))
            if native_name == NATIVE_INPROC_CONFIG:
                cp = _ThreadedControlPlane(config_from_dict(native_raw, source=str(native_path)))
                control_planes.append(cp)
                xds_port = cp.xds_port
            else:  # its own process, as deployed: off the load generator's CPU and GIL
                cp_svc = ServiceProcess("control-plane", "--config", str(native_path), "--xds", f"127.0.0.1:{free_port()}",
                                        "--status", f"127.0.0.1:{free_port()}")
                services.append(cp_svc)
                xds_port = int(cp_svc.start().ready["xds"])
            token = token_secret(config_from_dict(native_raw, source=str(native_path)))
            e = envoy(ads_bootstrap("root", "x", _hp(xds_port), a, node_id=f"root-x-{native_name}", token=token), native_name, a)
            _wait_http(p)
            assert e.proc is not None  # started by envoy()
            targets[native_name] = (p, {"root_envoy": e.proc.pid})
        if TRACED_CONFIG in configs:
            from dlb.envoy.tracing import EnvoyTracing, add_tracing

            p, a = free_port(), free_port()
            b = root_bootstrap(cfg, "x", admin_port=a, listen=_hp(p), ext_proc=_hp(traced_port))
            _point_cluster(b, "cell-x", up_port)
            add_tracing(b, EnvoyTracing(_hp(otlp_port), trace_ratio), "dlb-root-envoy")
            targets[TRACED_CONFIG] = (p, {"root_envoy": envoy(b, TRACED_CONFIG, a).pid, "root_ext_proc": root_traced.pid})
        if GRPC_CONFIG in configs:
            p, pid = root_to_upstream(GRPC_CONFIG, grpc_port)
            targets[GRPC_CONFIG] = (p, {"root_envoy": pid, "root_ext_proc": root_grpc.pid})
        if W2_CONFIG in configs:
            p, pid = root_to_upstream(W2_CONFIG, w2_port)
            pids = {"root_envoy": pid, "root_ext_proc": root_w2.pid}
            pids.update({f"root_ext_proc_w{k + 1}": pid for k, pid in enumerate(root_w2.ready.get("worker_pids", []))})
            targets[W2_CONFIG] = (p, pids)
        if MTLS_CONFIG in configs:
            p, a = free_port(), free_port()
            b = root_bootstrap(cfg_tls, "x", admin_port=a, listen=_hp(p))  # its ext_proc cluster speaks mTLS
            _point_cluster(b, "cell-x", up_port)
            targets[MTLS_CONFIG] = (p, {"root_envoy": envoy(b, MTLS_CONFIG, a).pid, "root_ext_proc": root_tls.pid})
        if LR_CONFIG in configs:
            from dataclasses import replace

            cell = cfg.cell("x")
            cfg_lr = replace(cfg, cells=(replace(cell, leaf=replace(cell.leaf, ext_proc=None)),))
            p, a, leaf_port, la = free_port(), free_port(), free_port(), free_port()
            b = root_bootstrap(cfg, "x", admin_port=a, listen=_hp(p))
            _point_cluster(b, "cell-x", leaf_port)
            leaf_env = envoy(leaf_bootstrap(cfg_lr, "x", admin_port=la, emulate_wan=False, listen=_hp(leaf_port), access_log=True),
                             "leaf-lr", la)
            targets[LR_CONFIG] = (p, {"root_envoy": envoy(b, "root-leaf-lr", a).pid, "root_ext_proc": root_svc.pid,
                                      "leaf_envoy": leaf_env.pid, "leaf_agent": leaf_svc.pid})
        if RESP_CONFIG in configs:
            p, a = free_port(), free_port()
            leaf_port = free_port()
            b = root_bootstrap(cfg, "x", admin_port=a, listen=_hp(p))
            _point_cluster(b, "cell-x", leaf_port)
            la = free_port()
            lb = leaf_bootstrap(cfg, "x", admin_port=la, emulate_wan=False, listen=_hp(leaf_port), access_log=True)
            _leaf_response_processing(lb)
            leaf_env = envoy(lb, "leaf-resp", la)
            targets[RESP_CONFIG] = (p, {"root_envoy": envoy(b, "root-leaf-resp", a).pid, "root_ext_proc": root_svc.pid,
                                         "leaf_envoy": leaf_env.pid, "leaf_agent": leaf_svc.pid})

        traced_requests = 0  # every request sent through root-traced, warm-up included: what the spans come from

        async def measure(name: str, mode: str, rate: float | None, slice_s: float) -> tuple[LoadResult, dict[str, float]]:
            nonlocal traced_requests
            out = await _measure(targets[name], mode, connections=connections, rate=rate, duration_s=slice_s, loadgen=loadgen)
            if name == TRACED_CONFIG:
                traced_requests += len(out[0].latencies_s)
            return out

        async def main() -> None:
            await asyncio.sleep(1.0)  # probes warm up: the root needs fresh state for its cell
            for name in configs:  # warm-up pass: connections, caches, JIT-less Python paths
                await measure(name, "closed", None, min(1.0, duration_s))
            # Interleave the configurations in short slices and pool them: background load on a shared
            # machine drifts, and slicing spreads the drift evenly over the configurations compared.
            slice_s = duration_s / slices
            sat: dict[str, float] = {}
            # The floor runs twice per slice (A, then A' last): the spread of A'/A is the run's noise band.
            measured = [*configs, FLOOR + AA_SUFFIX] if FLOOR in configs else list(configs)
            for mode in ("closed", "open"):
                rate = None if mode == "closed" else round(0.5 * (sat.get("root") or max(sat.values())), 1)
                pooled: dict[str, list[tuple[LoadResult, dict[str, float]]]] = {n: [] for n in measured}
                for k in range(slices):
                    # Alternate the order so no configuration always follows the same one (warm caches, drift).
                    order = list(configs) if k % 2 == 0 else list(reversed(configs))
                    for name in order + measured[len(configs):]:
                        pooled[name].append(await measure(name.removesuffix(AA_SUFFIX), mode, rate, slice_s))
                for name in measured:
                    res, cpu = _pool(pooled[name])
                    rec = _record(name, mode, rate, res, cpu, connections if mode == "closed" else None, loadgen)
                    rec["slices"] = [_slice_json(r, c) for r, c in pooled[name]]
                    records.append(rec)
                    if mode == "closed":
                        sat[name] = res.rps
                    log.info("bench_point", **{k: v for k, v in rec.items() if k != "slices"})

        from dlb.service.runner import run_event_loop

        run_event_loop(main())
        if TRACED_CONFIG in configs:
            root_traced.stop()  # its exporter flushes on exit; Envoy's flushes on its own period (5 s)
            spans = _settled_count(collector)
            for rec in records:
                if rec["config"] == TRACED_CONFIG:
                    rec["trace"] = {"sample_ratio": trace_ratio, "spans_exported": spans, "requests_sent": traced_requests}
    finally:
        for e in envoys:
            e.stop()
        for s in services:
            s.stop()
        for bp in bare_procs:
            bp.terminate()
            bp.wait(10)
        for cp in control_planes:
            cp.stop()
        if collector is not None:
            collector.stop()
        tmp.cleanup()
    return records


def _settled_count(collector: Any, quiet_s: float = 6.0, limit_s: float = 20.0) -> int:
    """The collector's span count once no export has arrived for ``quiet_s`` (longer than Envoy's 5-s flush)."""
    deadline = time.monotonic() + limit_s
    last, since = collector.count, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.25)
        if collector.count != last:
            last, since = collector.count, time.monotonic()
    return int(last)


def _hp(port: int):
    from dlb.config import HostPort

    return HostPort("127.0.0.1", port)


def summarize(records: list[dict[str, Any]]) -> str:
    """Added latency and throughput ratios against ``plain`` (same run)."""
    def pick(config: str, mode: str) -> dict[str, Any] | None:
        rows = [r for r in records if r["config"] == config and r["mode"] == mode]
        return min(rows, key=lambda r: r["p50_ms"]) if rows else None

    lines = [f"{'config':<10} {'mode':<6} {'rate':>8} {'p50 ms':>8} {'p99 ms':>8} {'rps':>8} {'cpu s/1k':>9} {'+p50':>7} {'+p99':>7} {'rps/plain':>9}"]
    for r in records:
        base = pick("plain", r["mode"])
        dp50 = r["p50_ms"] - base["p50_ms"] if base else float("nan")
        dp99 = r["p99_ms"] - base["p99_ms"] if base else float("nan")
        ratio = r["rps"] / base["rps"] if base and base["rps"] else float("nan")
        rate = f"{r['rate']:.0f}" if r["rate"] else "-"
        lines.append(f"{r['config']:<10} {r['mode']:<6} {rate:>8} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['rps']:>8.0f} "
                     f"{(r['cpu_s_per_1k'] or 0):>9.4f} {dp50:>7.3f} {dp99:>7.3f} {ratio:>9.2f}")
    return "\n".join(lines)


def _samples(record: dict[str, Any]) -> list[stats.SliceSample]:
    return [stats.SliceSample(sl["cpu_s"], sl["requests"], sl["p50_ms"] or float("nan")) for sl in record["slices"]]


def floor_ratios(records: list[dict[str, Any]]) -> tuple[dict[str, stats.Ratio], float]:
    """Attach each record's per-slice ratios to the floor in its mode (``cpu_vs_floor``, ``p50_vs_floor``);
    return the open loop's CPU ratios by configuration and the A/A noise band of that ratio.

    The open loop is the budget's mode: every configuration gets the same offered load there, so CPU per
    request compares like with like (at saturation each configuration batches differently).
    """
    cpu: dict[str, stats.Ratio] = {}
    band = float("nan")
    for mode in ("closed", "open"):
        floor = next((r for r in records if r["config"] == stats.FLOOR and r["mode"] == mode), None)
        if floor is None or "slices" not in floor:
            continue
        for r in records:
            if r["mode"] != mode or "slices" not in r:
                continue
            c = stats.ratio(_samples(r), _samples(floor), "cpu_ms_per_req")
            r["cpu_vs_floor"] = c.as_json()
            r["p50_vs_floor"] = stats.ratio(_samples(r), _samples(floor), "p50_ms").as_json()
            if mode == "open":
                if r["config"] == stats.FLOOR + stats.AA_SUFFIX:
                    band = stats.noise_band(c)
                else:
                    cpu[r["config"]] = c
    return cpu, band


def budget_targets(budgets: dict[str, float] | None, cpu: dict[str, stats.Ratio], band: float, kind: str) -> list[harness.Target]:
    """The verdicts: each budgeted configuration's open-loop CPU per request vs its committed ratio."""
    if budgets is None:
        return [harness.Target(f"CPU budgets for machine kind {kind}", None, "none for this kind, or a smoke run")]
    return [harness.Target(v.rule(stats.FLOOR, kind), v.holds, v.figure()) for v in stats.budget_verdicts(budgets, cpu, band)]


def ratio_lines(records: list[dict[str, Any]], band: float) -> str:
    """The same-run ratios to the floor, median over slices, and the A/A band they must exceed to mean anything."""
    rows = [r for r in records if "cpu_vs_floor" in r]
    if not rows:
        return ""
    lines = [f"vs {stats.FLOOR} (median of per-slice ratios; A/A noise band +-{band:.3f} on open-loop CPU/request):",
             f"{'config':<22} {'mode':<6} {'cpu/req':>8} {'p50':>7}"]
    for r in rows:
        lines.append(f"{r['config']:<22} {r['mode']:<6} {r['cpu_vs_floor']['median']:>8.3f} {r['p50_vs_floor']['median']:>7.3f}")
    hop = root_hop_figures(records)
    if hop:
        lines.append("root-hop figures, median of slices [95 % CI of the median] (targets: added p50 <= 1.10, rps >= 0.95):")
        for name, fig in hop.items():
            lines.append(f"  {name}: " + "; ".join(_figure_text(k, v) for k, v in fig.items()))
    return "\n".join(lines)


#: Fewer slices than this give no interval: a bootstrap of one or two values would read as "resolved".
MIN_SLICES_FOR_CI = 4


def _figure(values: list[float]) -> dict[str, Any]:
    ci = [round(v, 4) for v in stats.median_ci(values)] if len(values) >= MIN_SLICES_FOR_CI else None
    return {"median": round(float(np.median(values)), 4), "ci95": ci, "per_slice": [round(v, 4) for v in values]}


def _figure_text(name: str, fig: dict[str, Any]) -> str:
    ci = fig["ci95"]
    band = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"[no interval: {len(fig['per_slice'])} slices]"
    return f"{name.replace('_', ' ')} {fig['median']:.3f} {band}"


def root_hop_figures(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The root-hop target's two figures per configuration, slice by slice against the floor's same slice, with
    a bootstrap interval of their median so one run says whether it resolves a target or cannot:
    ``added_p50`` (open loop, equal offered load): (p50 − plain's) ÷ (floor's p50 − plain's); ``closed_rps``:
    requests in the closed-loop slice ÷ the floor's (slices are of equal length). Also stored on the records."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    by = {(r["config"], r["mode"]): r for r in records if "slices" in r}
    plain, floor = by.get(("plain", "open")), by.get((stats.FLOOR, "open"))
    closed_floor = by.get((stats.FLOOR, "closed"))
    for (name, mode), r in by.items():
        if name in ("plain", stats.FLOOR):
            continue
        if mode == "open" and plain is not None and floor is not None:
            x = [(sl["p50_ms"] - b["p50_ms"]) / (f["p50_ms"] - b["p50_ms"])
                 for sl, b, f in zip(r["slices"], plain["slices"], floor["slices"], strict=True) if f["p50_ms"] - b["p50_ms"] > 0]
            if x:
                r["added_p50_vs_floor"] = out.setdefault(name, {})["added_p50"] = _figure(x)
        if mode == "closed" and closed_floor is not None:
            x = [sl["requests"] / f["requests"] for sl, f in zip(r["slices"], closed_floor["slices"], strict=True) if f["requests"]]
            if x:
                r["rps_vs_floor"] = out.setdefault(name, {})["closed_rps"] = _figure(x)
    return out


def traced_targets(records: list[dict[str, Any]]) -> list[harness.Target]:
    """Tracing's verdicts: its open-loop CPU per request against ``root`` slice by slice, and that spans arrived
    (a traced run that exported nothing measured an untraced root)."""
    by = {r["config"]: r for r in records if r["mode"] == "open" and "slices" in r}
    traced = by.get(TRACED_CONFIG)
    if traced is None:
        return []
    trace = traced.get("trace", {})
    spans, sent = trace.get("spans_exported", 0), trace.get("requests_sent", 0)
    ratio = trace.get("sample_ratio", TRACE_RATIO)
    out = [harness.Target(f"{TRACED_CONFIG}: spans reach the OTLP collector at {ratio:g} sampling", spans > 0,
                          f"{spans} spans from {sent} requests ({100 * spans / sent if sent else 0:.2f} per 100)")]
    if "root" in by:
        r = stats.ratio(_samples(traced), _samples(by["root"]), "cpu_ms_per_req")
        traced["cpu_vs_root"] = r.as_json()
        lo, hi = stats.median_ci(r.per_slice)
        out.append(harness.Target(f"{TRACED_CONFIG}: CPU per request <= {TRACED_CPU_TARGET:g} x root's in the same slices "
                                  f"at {ratio:g} sampling",
                                  r.median <= TRACED_CPU_TARGET if np.isfinite(r.median) else None,
                                  f"{r.median:.3f} x (95 % CI of the median {lo:.3f}-{hi:.3f}, {len(r.per_slice)} slices)"))
    return out


def run(args: argparse.Namespace) -> int:
    duration = 0.5 if args.smoke else args.duration
    connections = 4 if args.smoke else args.connections
    loadgen = resolve_loadgen(args.loadgen)
    kind = args.machine_kind or stats.machine_kind()
    # A smoke run's half-second slice cannot hold a ratio to a budget: only a budgets file named on the
    # command line is enforced there (the committed one is for real runs).
    path = args.budgets if args.budgets is not None else None if args.smoke else stats.BUDGETS_FILE
    try:
        budgets = stats.load_budgets(path, kind) if path is not None else None
    except ValueError as e:
        raise DlbError(f"dlb bench overhead --budgets: {e}") from None
    configs = tuple(args.configs)
    if budgets and any(c in budgets for c in configs) and stats.FLOOR not in configs:
        configs = (stats.FLOOR, *configs)  # a budget is a ratio to the floor in the same run
    if TRACED_CONFIG in configs and "root" not in configs:
        configs = ("root", *configs)  # tracing's cost is a ratio to the same root untraced
    record = harness.start()  # the code that runs, and the box's load, before the run
    records = run_overhead(duration, connections, configs, slices=1 if args.smoke else args.slices, loadgen=loadgen,
                           envoy_concurrency=args.envoy_concurrency, trace_ratio=args.trace_ratio)
    cpu, band = floor_ratios(records)
    print(summarize(records))
    print(ratio_lines(records, band))
    targets = budget_targets(budgets, cpu, band, kind) + traced_targets(records)
    return harness.finish(record, records, targets, json_path=args.json)  # every row names the code that produced it
