"""``dlb serve epp`` behind a real Envoy configured the way a GIE gateway configures one.

The Envoy config below is written from GIE's documents (its standalone chart's ``envoy.yaml`` and the
endpoint-picker protocol), not from DLB's bootstrap code: an ext_proc filter sending headers, bodies
(FULL_DUPLEX_STREAMED) and trailers both ways, with ``failure_mode_allow`` as the InferencePool's
``failureMode`` says, and

- FailClose: the route's ``original_destination_cluster``, an ORIGINAL_DST cluster reading the
  ``x-gateway-destination-endpoint`` header (``use_http_header``);
- FailOpen: a pool cluster whose override-host load balancer reads the EPP's ``envoy.lb`` dynamic
  metadata, and picks by least request itself when the EPP gave none ("an endpoint of its picking").

What is checked comes from the servers and Envoy, not from the EPP: each request's Envoy access-log line
(the header the EPP set, the upstream Envoy used) and the emulated server's own name in its reply, and
each server's own count of requests served against the EPP's count of picks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from bounded_wait import until

from dlb.envoy.binary import EnvoyProcess
from dlb.launch.metrics_text import metric_value
from dlb.procutil import free_port
from dlb.testbed.emulator import EmulatorProcess
from dlb.testbed.process import ServiceProcess

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]

DEST = "x-gateway-destination-endpoint"
#: One access-log line per request: the EPP's header, its metadata, the upstream Envoy used, the server's own name.
#: ``rid`` is a client's own request id (``x-dlb-run-id``), for research/epp/gie_run.py to join lines to requests.
LOG_FORMAT = (f'{{"rid":"%REQ(x-dlb-run-id)%","dest":"%REQ({DEST})%","meta":"%DYNAMIC_METADATA(envoy.lb:{DEST})%","upstream":"%UPSTREAM_HOST%",'
              '"server":"%RESP(x-dlb-server)%","code":"%RESPONSE_CODE%","flags":"%RESPONSE_FLAGS%"}\n')
REQUESTS = int(os.environ.get("DLB_EPP_E2E_REQUESTS", "300"))


def gateway(port: int, admin: int, epp_port: int, pool: list[str], log_path: Path, fail_open: bool,
            subset: list[str] | None = None) -> dict[str, Any]:
    """A GIE-style gateway Envoy for one InferencePool whose EPP listens on ``epp_port``; with ``subset``, a
    ``set_metadata`` filter before the ext_proc sets the protocol's subset hint for every request."""
    ext_proc = {
        "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": "10s"},
        # Envoy 1.40 cannot fail open once a FULL_DUPLEX_STREAMED request body went to the dead stream (measured:
        # every request 500): a FailOpen gateway sends the EPP no request body, which DLB's pick does not read.
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "NONE" if fail_open else "FULL_DUPLEX_STREAMED",
                            "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        "message_timeout": "1000s",
        "failure_mode_allow": fail_open,
        # The EPP's envoy.lb metadata is accepted (receiving) and the gateway's is sent to it (forwarding).
        "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
                             "receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }
    if fail_open:
        pool_cluster = {
            "name": "pool", "type": "STATIC", "connect_timeout": "5s",
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": a.rsplit(":", 1)[0], "port_value": int(a.rsplit(":", 1)[1])}}}}
                for a in pool]}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                    "override_host_sources": [{"metadata": {"key": "envoy.lb", "path": [{"key": DEST}]}}],
                    "fallback_policy": {"policies": [{"typed_extension_config": {
                        "name": "envoy.load_balancing_policies.least_request",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest"},
                    }}]},
                }}}]},
        }
    else:
        pool_cluster = {"name": "pool", "type": "ORIGINAL_DST", "connect_timeout": "5s", "lb_policy": "CLUSTER_PROVIDED",
                        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DEST}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "inference", "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "inference",
                    "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                        "path": str(log_path), "log_format": {"text_format_source": {"inline_string": LOG_FORMAT}}}}],
                    "route_config": {"virtual_hosts": [{"name": "pool", "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": "pool", "timeout": "300s"}}]}]},
                    "http_filters": [
                        *([{"name": "envoy.filters.http.set_metadata", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
                            "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                                          "value": {"x-gateway-destination-endpoint-subset": subset}}]}}] if subset else []),
                        {"name": "envoy.filters.http.ext_proc", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor", **ext_proc}},
                        {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", "suppress_envoy_headers": True}},
                    ],
                }}]}],
            }],
            "clusters": [pool_cluster, {
                "name": "ext_proc", "type": "STATIC", "connect_timeout": "1s", "lb_policy": "LEAST_REQUEST",
                "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
                # no_traffic_interval too: Envoy checks an idle cluster only every 60 s by default, so a gateway
                # started before its EPP kept the picker failed for a minute (a stranger copying this config).
                "health_checks": [{"timeout": "1s", "interval": "0.5s", "no_traffic_interval": "1s", "unhealthy_threshold": 2,
                                   "healthy_threshold": 1,
                                   "grpc_health_check": {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}}],
                "load_assignment": {"cluster_name": "ext_proc", "endpoints": [{"lb_endpoints": [{"endpoint": {
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": epp_port}}}}]}]},
            }],
        },
    }


class Pool:
    """Three emulated servers, the EPP for them and a GIE-style gateway Envoy in front."""

    def __init__(self, tmp: Path, fail_open: bool, subset: int | None = None) -> None:
        self.tmp = tmp
        self.fail_open = fail_open
        self.subset = subset
        self.servers = [EmulatorProcess(server_id=f"s{i}", profile="fast-test", max_batch=32, max_queue=512) for i in range(3)]
        self.epp: ServiceProcess | None = None
        self.envoy: EnvoyProcess | None = None
        self.port = free_port()
        self.log = tmp / "access.log"

    def __enter__(self) -> Pool:
        for s in self.servers:
            s.start()
        self.by_name = {f"s{i}": s.address for i, s in enumerate(self.servers)}
        epp_port, self.metrics_port = free_port(), free_port()
        cfg = {"version": 1, "cells": [{"name": "pool", "leaf": {"address": f"127.0.0.1:{self.port}", "probe": f"127.0.0.1:{epp_port}"},
                                        "servers": [s.address for s in self.servers]}],
               "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
        (self.tmp / "dlb.yaml").write_text(yaml.safe_dump(cfg))
        self.epp = ServiceProcess("epp", "--config", str(self.tmp / "dlb.yaml"), "--cell", "pool", "--metrics",
                                  f"127.0.0.1:{self.metrics_port}", "--drain-s", "0").start()
        boot = self.tmp / "envoy.yaml"
        admin = free_port()
        hint = [self.servers[self.subset].address] if self.subset is not None else None
        boot.write_text(yaml.safe_dump(gateway(self.port, admin, epp_port, [s.address for s in self.servers], self.log, self.fail_open,
                                               hint)))
        self.envoy = EnvoyProcess(str(boot), admin).start()
        until(lambda: "health_flags::healthy" in self.clusters(), "the gateway sees its EPP healthy (GIE's health service name)")
        return self

    def clusters(self) -> str:
        assert self.envoy is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.envoy.admin_port}/clusters", timeout=5) as r:
            return "\n".join(line for line in r.read().decode().splitlines() if line.startswith("ext_proc::"))

    def __exit__(self, *exc: object) -> None:
        for p in (self.envoy, self.epp, *self.servers):
            if p is not None:
                p.stop()

    def served(self) -> dict[str, float]:
        """Each server's own count of requests it finished (its vLLM-style /metrics)."""
        out = {}
        for s in self.servers:
            with urllib.request.urlopen(f"{s.url}/metrics", timeout=5) as r:
                text = r.read().decode()
            out[s.address] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                 if line.startswith("vllm:request_success_total"))
        return out

    def picks(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {s.address: metric_value(text, "dlb_leaf_server_picks_total", server=s.address) or 0.0 for s in self.servers}

    def kill_epp_and_send(self, n: int) -> tuple[dict[str, float], list[tuple[int, str, bytes]]]:
        """SIGKILL the EPP, then send ``n`` requests: (each server's count before, the results)."""
        assert self.epp is not None and self.epp.proc is not None
        os.kill(self.epp.pid, signal.SIGKILL)
        self.epp.proc.wait(10)
        before = self.served()
        return before, asyncio.run(send(self.port, n, concurrency=4))

    def restart_epp(self) -> None:
        """Start the killed EPP again on its port, and wait for the gateway's health check to see it."""
        assert self.epp is not None
        self.epp.spawn()
        self.epp.wait_ready()
        until(lambda: "health_flags::healthy" in self.clusters(), "the gateway sees its restarted EPP healthy")

    def log_lines(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()] if self.log.exists() else []


async def send(port: int, n: int, concurrency: int = 16, tag: str = "") -> list[tuple[int, str, bytes]]:
    """``n`` OpenAI chat requests, every other one streamed, ``tag-i`` in the log's ``rid``; (status, x-dlb-server, body) each."""
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:

        async def one(i: int) -> tuple[int, str, bytes]:
            body = {"model": "dlb-emulated", "messages": [{"role": "user", "content": f"hello {i}" * (1 + i % 7)}],
                    "max_tokens": 4 + i % 5, "stream": i % 2 == 0}
            async with sem, http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                                      headers={"x-dlb-run-id": f"{tag}-{i}"}) as r:
                return r.status, r.headers.get("x-dlb-server", ""), await r.read()

        return await asyncio.gather(*(one(i) for i in range(n)))


def check_all_went_where_picked(pool: Pool, results: list[tuple[int, str, bytes]], key: str, spread: bool = True) -> None:
    assert [r[0] for r in results] == [200] * len(results), [r[:2] for r in results if r[0] != 200][:5]
    for _status, _server, body in results[::2]:  # the streamed ones end as an OpenAI stream does
        assert body.rstrip().endswith(b"data: [DONE]")
    until(lambda: len(pool.log_lines()) >= len(results), "one access-log line per request")
    lines = pool.log_lines()
    assert len(lines) == len(results)
    for line in lines:
        # The gateway went to exactly the endpoint the EPP named, and the server there says it served it.
        assert line[key] == line["upstream"] == pool.by_name[line["server"]], line
    served, picks = pool.served(), pool.picks()
    assert served == picks, (served, picks)
    assert sum(served.values()) == len(results) and (min(served.values()) > 0 or not spread)


def check_the_restarted_epp_picks_again(pool: Pool, key: str, n: int = 20) -> None:
    """After a restart, every request goes where the new EPP picks (its counts start from zero)."""
    before = pool.served()
    pool.restart_epp()
    results = asyncio.run(send(pool.port, n, concurrency=4, tag="restarted"))
    assert [r[0] for r in results] == [200] * n

    def restarted() -> list[dict[str, str]]:
        return [line for line in pool.log_lines() if line["rid"].startswith("restarted-")]

    lines = until(lambda: len(restarted()) == n and restarted(), "a log line per request after the restart")
    assert all(line[key] == line["upstream"] == pool.by_name[line["server"]] for line in lines), lines
    assert {a: v - before[a] for a, v in pool.served().items()} == pool.picks()


def test_fail_close_gateway_routes_by_the_epp_header_drops_requests_while_the_epp_is_dead_and_recovers(tmp_path: Path) -> None:
    with Pool(tmp_path, fail_open=False) as pool:
        results = asyncio.run(send(pool.port, REQUESTS))
        check_all_went_where_picked(pool, results, "dest")
        before, after = pool.kill_epp_and_send(20)
        assert all(status >= 500 for status, _, _ in after), [s for s, _, _ in after]  # FailClose: dropped
        assert pool.served() == before  # and none reached a server
        check_the_restarted_epp_picks_again(pool, "dest")


def test_fail_open_gateway_reads_the_epp_metadata_picks_itself_while_the_epp_is_dead_and_recovers(tmp_path: Path) -> None:
    with Pool(tmp_path, fail_open=True) as pool:
        results = asyncio.run(send(pool.port, REQUESTS // 3))
        check_all_went_where_picked(pool, results, "meta")
        before, after = pool.kill_epp_and_send(30)
        assert [s for s, _, _ in after] == [200] * 30  # FailOpen: forwarded to an endpoint of Envoy's picking
        gained = {a: pool.served()[a] - before[a] for a in before}
        assert sum(gained.values()) == 30 and sum(1 for v in gained.values() if v > 0) >= 2
        check_the_restarted_epp_picks_again(pool, "meta")


def test_the_gateways_subset_hint_confines_the_pick(tmp_path: Path) -> None:
    with Pool(tmp_path, fail_open=False, subset=1) as pool:
        results = asyncio.run(send(pool.port, 40))
        check_all_went_where_picked(pool, results, "dest", spread=False)
        only = pool.servers[1].address
        assert pool.served() == {s.address: 40.0 if s.address == only else 0.0 for s in pool.servers}
