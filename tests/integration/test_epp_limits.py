"""``dlb serve epp``'s own metrics and its bounded gRPC listener, against the real process and a real gRPC client.

Rules: past ``--max-streams`` open ext_proc streams a new one is refused with RESOURCE_EXHAUSTED and counted,
while health checks still answer (the RPC cap leaves room for them); a message over ``--max-message-bytes`` is
refused by gRPC and the EPP goes on; ``dlb_epp_picks`` counts each pick by outcome, ``dlb_epp_served_moves``
each response the gateway reports served by another endpoint; ``dlb_epp_grpc_limit`` shows the bounds.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from scrape import metric_samples

from dlb.epp import health, protocol
from dlb.procutil import free_port
from dlb.testbed.process import ServiceProcess

pytestmark = pytest.mark.timeout(120)
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
SERVERS = ["127.0.0.1:1", "127.0.0.1:2"]


def headers(subset: list[str] | None = None) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions")])))
    if subset is not None:
        req.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].update({protocol.SUBSET_KEY: subset})
    return req


class Stream:
    """One ext_proc stream held open: send messages one by one, read each reply."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.sent: queue.Queue[ep.ProcessingRequest | None] = queue.Queue()
        call = channel.stream_stream(PROCESS, request_serializer=ep.ProcessingRequest.SerializeToString,
                                     response_deserializer=ep.ProcessingResponse.FromString)
        self.replies: Iterator[ep.ProcessingResponse] = call(iter(self.sent.get, None), timeout=30)

    def send(self, req: ep.ProcessingRequest) -> ep.ProcessingResponse:
        self.sent.put(req)
        return next(self.replies)

    def close(self) -> None:
        self.sent.put(None)


def destination(reply: ep.ProcessingResponse) -> str | int:
    if reply.HasField("immediate_response"):
        return int(reply.immediate_response.status.code)
    return reply.request_headers.response.header_mutation.set_headers[0].header.raw_value.decode()


def start(tmp_path: Path, *flags: str) -> ServiceProcess:
    port = free_port()
    cfg = {"version": 1, "cells": [{"name": "pool", "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{port}"},
                                    "servers": SERVERS}], "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    (tmp_path / "dlb.yaml").write_text(yaml.safe_dump(cfg))
    return ServiceProcess("epp", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool", "--scrape-period-ms", "0",
                          "--metrics", "127.0.0.1:0", *flags)


def test_streams_past_the_cap_are_refused_and_counted_while_health_answers(tmp_path: Path) -> None:
    with start(tmp_path, "--max-streams", "2", "--max-message-bytes", "65536") as epp, \
            grpc.insecure_channel(f"127.0.0.1:{epp.ready['grpc']}") as ch:
        metrics = f"127.0.0.1:{epp.ready['metrics']}"
        held = [Stream(ch), Stream(ch)]
        assert {destination(s.send(headers())) for s in held} <= set(SERVERS)
        with pytest.raises(grpc.RpcError) as refused:
            Stream(ch).send(headers())
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "2 ext_proc streams open" in str(refused.value.details())
        check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        assert check(b"\x0a\x09readiness", timeout=5) == health.SERVING  # the RPC cap leaves room for health and probes
        m = metric_samples(metrics)
        assert m["dlb_epp_grpc_streams_refused_total"] == 1
        assert m["dlb_epp_grpc_limit{limit=max_streams}"] == 2 and m["dlb_epp_grpc_limit{limit=max_rpcs}"] == 66
        assert m["dlb_epp_grpc_limit{limit=max_message_bytes}"] == 65536
        held.pop().close()
        big = Stream(ch)  # a free place again, but a message over the bound: gRPC refuses it, the EPP goes on
        with pytest.raises(grpc.RpcError) as too_big:
            big.send(ep.ProcessingRequest(request_body=ep.HttpBody(body=b"x" * 70_000)))
        assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        fresh = Stream(ch)
        assert destination(fresh.send(headers())) in SERVERS
        for s in (*held, fresh):
            s.close()


def test_picks_are_counted_by_outcome_and_served_moves_by_the_gateways_report(tmp_path: Path) -> None:
    with start(tmp_path) as epp, grpc.insecure_channel(f"127.0.0.1:{epp.ready['grpc']}") as ch:
        metrics = f"127.0.0.1:{epp.ready['metrics']}"
        s = Stream(ch)
        picked = destination(s.send(headers(["127.0.0.1:1"])))
        assert picked == "127.0.0.1:1"
        served = ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200")]), end_of_stream=True))
        served.metadata_context.filter_metadata[protocol.LB_NAMESPACE].update({protocol.SERVED_KEY: "127.0.0.1:2"})
        s.send(served)  # a retry moved it: the gateway says the other endpoint served
        s.close()
        outcomes = [destination(Stream(ch).send(headers(h))) for h in (None, [], ["10.9.9.9:1"], ["10.9.9.9:1"])]
        assert outcomes[0] in SERVERS and outcomes[1:] == [503, 503, 503]
        m = metric_samples(metrics)
        assert {k: m[f"dlb_epp_picks_total{{outcome={k}}}"] for k in ("picked", "no_capacity", "shed", "hint_empty", "hint_foreign")} == \
            {"picked": 2, "no_capacity": 0, "shed": 0, "hint_empty": 1, "hint_foreign": 2}
        assert m["dlb_epp_served_moves_total"] == 1
        assert m["dlb_epp_pool_endpoints"] == 2 and m["dlb_epp_pool_source{state=static}"] == 1
        assert m["dlb_epp_pool_updates_total{what=endpoints}"] == 0 and "dlb_epp_pool_watch_errors_total{watch=pods}" not in m


def test_a_graceful_stop_lets_the_streams_in_flight_finish_and_a_second_signal_ends_the_grace(tmp_path: Path) -> None:
    """A stream the EPP carries lasts its request's whole generation (FULL_DUPLEX_STREAMED): after SIGTERM
    and the drain it must still be served (it was cut 2 s later, losing every answer in flight), while a
    second SIGTERM ends the wait at once."""
    import signal
    import time

    with start(tmp_path, "--drain-s", "0", "--grace-s", "60") as epp, grpc.insecure_channel(f"127.0.0.1:{epp.ready['grpc']}") as ch:
        assert epp.proc is not None
        s = Stream(ch)
        assert destination(s.send(headers())) in SERVERS
        epp.proc.send_signal(signal.SIGTERM)
        time.sleep(4.0)  # past the old 2-s grace
        chunk = s.send(ep.ProcessingRequest(response_body=ep.HttpBody(body=b"data: {}\n\n")))
        assert chunk.HasField("response_body"), chunk  # still served
        assert epp.proc.poll() is None
        epp.proc.send_signal(signal.SIGTERM)
        epp.proc.wait(timeout=10)
