"""The GIE endpoint picker's side of the EPP protocol, message by message (pure: no sockets, clock passed in).

Each test states the rule of GIE's ``004-endpoint-picker-protocol`` it checks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from dlb.core.latency_model import LatencyParams
from dlb.epp import health, protocol
from dlb.epp.picker import EndpointPicker
from dlb.epp.pool import pool_servers
from dlb.ext_proc.leaf_state import LeafState, ServerState
from dlb.service.health import HealthState

ADDRS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
FULL_DUPLEX = ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED


def picker(**kw) -> EndpointPicker:
    st = LeafState(cell="pool", servers=[ServerState(a) for a in ADDRS], replicas=3, prior=LatencyParams(0.1, 0.01, 4.0, 1.0),
                   choices=3, rng=np.random.default_rng(0))
    return EndpointPicker(st, **kw)


def headers(*pairs: tuple[str, str], end: bool = False, subset: list[str] | str | None = None,
            duplex: bool = False) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]), end_of_stream=end))
    if subset is not None:
        value = struct_pb2.Value()
        if isinstance(subset, str):
            value.string_value = subset
        else:
            value.list_value.values.extend(struct_pb2.Value(string_value=s) for s in subset)
        req.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].fields[protocol.SUBSET_KEY].CopyFrom(value)
    if duplex:
        req.protocol_config.request_body_mode = FULL_DUPLEX
        req.protocol_config.response_body_mode = FULL_DUPLEX
    return req


def picked(reply: bytes) -> tuple[str, str]:
    """(header value, envoy.lb metadata value) of a pick reply."""
    r = ep.ProcessingResponse.FromString(reply)
    (h,) = r.request_headers.response.header_mutation.set_headers
    assert h.header.key == "x-gateway-destination-endpoint"
    meta = r.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value
    return h.header.raw_value.decode(), meta


def response_headers(status: int, served: str | None = None, end: bool = False) -> ep.ProcessingRequest:
    req = ep.ProcessingRequest(response_headers=ep.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())]), end_of_stream=end))
    if served is not None:
        req.metadata_context.filter_metadata["envoy.lb"].fields[protocol.SERVED_KEY].string_value = served
    return req


def test_the_pick_is_named_in_the_header_and_in_envoy_lb_metadata_with_one_value():
    """EPP → data plane: header and dynamic metadata ``envoy.lb`` carry the same ``ip:port``."""
    epp = picker()
    seen = set()
    for _ in range(3):
        (reply,) = epp.stream().on_message(headers(("content-length", "400")), 0.0)
        header, meta = picked(reply)
        assert header == meta and header in ADDRS
        seen.add(header)
    assert seen == set(ADDRS)  # counted at pick time: join-the-shortest-queue over three endpoints
    assert [s.rif for s in epp.state.servers] == [1, 1, 1]


def test_the_subset_hint_restricts_the_pick():
    """Data plane → EPP: with ``x-gateway-destination-endpoint-subset`` set, pick only from that list."""
    epp = picker()
    for subset in ([ADDRS[1]], ADDRS[2]):  # a list, or one comma-separated string
        for _ in range(4):
            (reply,) = epp.stream().on_message(headers(subset=subset), 0.0)
            assert picked(reply)[0] == (subset[0] if isinstance(subset, list) else subset)


def test_an_empty_or_foreign_subset_gets_503_with_an_openai_body():
    """No eligible endpoint in the subset (or an empty one): ImmediateResponse 503; nothing counted."""
    epp = picker()
    for subset in ([], ["10.9.9.9:1"]):
        s = epp.stream()
        (reply,) = s.on_message(headers(subset=subset), 0.0)
        imm = ep.ProcessingResponse.FromString(reply).immediate_response
        assert imm.status.code == 503
        assert json.loads(imm.body)["error"]["code"] == "dlb_no_capacity"
        s.finish(1.0, aborted=True)
    assert epp.state.rif == 0 and epp.outcomes == {"picked": 0, "no_capacity": 0, "shed": 0, "hint_empty": 1, "hint_foreign": 1}
    epp.empty = True  # no ready pod: the pool's cause, whatever the hint says
    for subset in (None, ["10.9.9.9:1"]):
        epp.stream().on_message(headers(subset=subset), 2.0)
    assert epp.outcomes["no_capacity"] == 2 and epp.outcomes["hint_foreign"] == 1


def test_full_kv_caches_shed_with_429_only_when_asked():
    """A request to drop when the servers are saturated: ImmediateResponse 429 (off by default: it queues)."""
    for shed in (False, True):
        epp = picker(shed_when_full=shed)
        for i in range(3):
            epp.state.on_scrape(i, running=8.0, waiting=4.0, kv_usage=0.99)
        r = ep.ProcessingResponse.FromString(epp.stream().on_message(headers(), 0.0)[0])
        assert (r.WhichOneof("response") == "immediate_response") == shed
        if shed:
            assert r.immediate_response.status.code == 429
            assert json.loads(r.immediate_response.body)["error"]["code"] == "dlb_no_capacity"


def test_full_duplex_bodies_pass_through_chunk_by_chunk_and_the_end_releases_the_pick():
    """FULL_DUPLEX_STREAMED: every body chunk comes back as a streamed response; the response's end completes the request."""
    epp = picker()
    s = epp.stream()
    (reply,) = s.on_message(headers(("content-length", "40"), duplex=True), 0.0)
    address = picked(reply)[0]
    (body,) = s.on_message(ep.ProcessingRequest(request_body=ep.HttpBody(body=b'{"model":"m"}', end_of_stream=True)), 0.01)
    sr = ep.ProcessingResponse.FromString(body).request_body.response.body_mutation.streamed_response
    assert sr.body == b'{"model":"m"}' and sr.end_of_stream
    s.on_message(response_headers(200), 0.1)
    for i, chunk in enumerate((b"data: a\n\n", b"data: [DONE]\n\n")):
        (out,) = s.on_message(ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk, end_of_stream=i == 1)), 0.2 + i)
        assert ep.ProcessingResponse.FromString(out).response_body.response.body_mutation.streamed_response.body == chunk
    st = epp.state
    assert st.rif == 0 and st.completed == 1 and st.failed == 0
    assert st.servers[st.by_address[address]].completed == 1
    s.finish(5.0, aborted=True)  # the stream's end after the response's: nothing counted twice
    assert st.completed == 1


def test_served_metadata_moves_the_request_to_the_endpoint_that_served():
    """Data plane → EPP: ``x-gateway-destination-endpoint-served`` names where a retry really went."""
    epp = picker()
    s = epp.stream()
    first = picked(s.on_message(headers(), 0.0)[0])[0]
    other = next(a for a in ADDRS if a != first)
    s.on_message(response_headers(503, served=other, end=True), 0.5)
    st = epp.state
    assert st.servers[st.by_address[other]].errors == 1 and st.servers[st.by_address[first]].errors == 0
    assert st.rif == 0 and all(x.rif == 0 for x in st.servers) and epp.served_elsewhere == 1


def test_a_stream_cut_before_the_response_ends_releases_the_pick_without_an_error():
    epp = picker()
    s = epp.stream()
    s.on_message(headers(), 0.0)
    s.on_message(response_headers(200), 0.1)
    s.finish(0.2, aborted=True)
    assert epp.state.rif == 0 and epp.state.failed == 0


def test_health_answers_by_the_service_names_gie_uses():
    """``liveness`` always; ``readiness``, the ExternalProcessor and "" follow readiness and drain; others SERVICE_UNKNOWN."""
    def req(name: str) -> bytes:
        return b"\x0a" + bytes([len(name)]) + name.encode() if name else b""

    state, ready = HealthState(), [True]
    ask = lambda name: health.answer(health.requested_service(req(name)), state, lambda: ready[0])
    assert [ask(n) for n in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "", "other")] == [
        health.SERVING, health.SERVING, health.SERVING, health.SERVING, health.SERVICE_UNKNOWN]
    state.serving = False
    assert ask("liveness") == health.SERVING and ask("readiness") == health.NOT_SERVING
    state.serving, ready[0] = True, False
    assert ask("envoy.service.ext_proc.v3.ExternalProcessor") == health.NOT_SERVING


def test_dns_names_become_one_endpoint_per_address():
    from dlb.config.loader import config_from_dict

    cfg = config_from_dict({"version": 1, "cells": [{"name": "pool", "leaf": {"address": "127.0.0.1:1", "probe": "127.0.0.1:2"},
                                                      "servers": ["vllm.ns.svc:8000", "10.0.0.9:8000"]}],
                            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]})
    assert pool_servers(cfg, "pool", {}) == [("10.0.0.9:8000", 1.0)]  # the name has no address yet
    got = pool_servers(cfg, "pool", {"vllm.ns.svc": ["10.0.0.5", "10.0.0.4"]})
    assert [a for a, _ in got] == ["10.0.0.4:8000", "10.0.0.5:8000", "10.0.0.9:8000"]


def test_the_pool_follows_dns_and_keeps_the_last_addresses_when_a_lookup_fails():
    import asyncio

    from dlb.config.loader import config_from_dict
    from dlb.epp.pool import follow_dns
    from dlb.ext_proc.leaf_setup import state_from_config

    cfg = config_from_dict({"version": 1, "cells": [{"name": "pool", "leaf": {"address": "127.0.0.1:1", "probe": "127.0.0.1:2"},
                                                      "servers": ["vllm.ns.svc:8000"]}],
                            "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]})
    state = state_from_config(cfg, "pool", resolve=lambda h, p: ["10.0.0.1"])
    answers = iter([["10.0.0.1", "10.0.0.2"], OSError("SERVFAIL"), ["10.0.0.2"]])
    seen: list[list[str]] = []

    async def resolve(host: str, port: int) -> list[str]:
        a = next(answers)
        seen.append([s.address for s in state.servers])
        if isinstance(a, OSError):
            raise a
        return a

    async def run() -> None:
        task = asyncio.create_task(follow_dns(cfg, "pool", state, 0.001, resolve))
        while len(seen) < 3:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 5))
    # grown to two pods; a failed lookup changes nothing; then one pod left
    assert seen == [["10.0.0.1:8000"], ["10.0.0.1:8000", "10.0.0.2:8000"], ["10.0.0.1:8000", "10.0.0.2:8000"]]
    assert [s.address for s in state.servers] == ["10.0.0.2:8000"]


def test_listener_bounds_are_checked_and_become_grpc_core_arguments():
    """Every bound is > 0 and finite; the RPC cap leaves health and probes room above the stream cap."""
    from dlb.epp.limits import RPC_HEADROOM, GrpcLimits, StreamGate

    with pytest.raises(ValueError, match="max_streams must be > 0 and finite, got 0"):
        GrpcLimits(max_streams=0)
    with pytest.raises(ValueError, match="keepalive_time_s"):
        GrpcLimits(keepalive_time_s=float("inf"))
    opts = dict(GrpcLimits(max_streams=5, max_message_bytes=1024).server_options())
    assert opts["grpc.max_concurrent_streams"] == 5 + RPC_HEADROOM and opts["grpc.max_receive_message_length"] == 1024
    assert opts["grpc.keepalive_time_ms"] == 60_000 and opts["grpc.max_connection_idle_ms"] == 600_000
    assert opts["grpc.http2.ping_timeout_ms"] == opts["grpc.keepalive_timeout_ms"]  # gRPC's 60-s default otherwise
    gate = StreamGate(1)
    assert gate.enter() and not gate.enter() and gate.refused == 1
    gate.leave()
    assert gate.enter() and gate.open == 1


def test_the_pool_source_state_says_what_serves_the_endpoints():
    from types import SimpleNamespace

    from dlb.epp.metrics import pool_source

    assert pool_source(None, dns=False) == "static" and pool_source(None, dns=True) == "dns"
    w = SimpleNamespace(pool=SimpleNamespace(deleted=False), stats=SimpleNamespace(up={"pods": True, "inferencepool": True}))
    assert pool_source(w, dns=False) == "watching"
    w.stats.up["inferencepool"] = False
    assert pool_source(w, dns=False) == "watch_down"
    w.pool.deleted = True
    assert pool_source(w, dns=False) == "deleted"
