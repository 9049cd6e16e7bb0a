"""``dlb serve epp --otlp-endpoint``: a span per pick, exported over OTLP to a real in-process collector,
joined to the request's trace through its W3C ``traceparent``; nothing exported when the trace is not sampled."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml
from bounded_wait import until
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.procutil import free_port
from dlb.service.tracing import otlp_unavailable
from dlb.testbed.otlp_collector import Collector
from dlb.testbed.process import ServiceProcess

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(otlp_unavailable() is not None, reason=f"{otlp_unavailable()}")]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def pick(port: int, traceparent: str) -> ep.ProcessingResponse:
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in ((":path", "/v1/chat/completions"), ("traceparent", traceparent))])))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process",
                                request_serializer=ep.ProcessingRequest.SerializeToString,
                                response_deserializer=ep.ProcessingResponse.FromString)
        return next(iter(call(iter([req]), timeout=5)))


def test_a_pick_span_joins_the_requests_trace(tmp_path: Path) -> None:
    collector = Collector()
    otlp = collector.start()
    port = free_port()
    cfg = {"version": 1, "cells": [{"name": "pool", "leaf": {"address": f"127.0.0.1:{free_port()}", "probe": f"127.0.0.1:{port}"},
                                    "servers": ["127.0.0.1:1", "127.0.0.1:2"]}],
           "endpoints": [{"name": "chat", "match": {"prefix": "/v1/"}}]}
    (tmp_path / "dlb.yaml").write_text(yaml.safe_dump(cfg))
    try:
        with ServiceProcess("epp", "--config", str(tmp_path / "dlb.yaml"), "--cell", "pool", "--scrape-period-ms", "0",
                            "--otlp-endpoint", f"127.0.0.1:{otlp}", "--trace-sample-ratio", "0"):
            unsampled = pick(port, f"00-{'1' * 32}-{PARENT}-00")  # the caller did not sample: ratio 0 keeps it out
            sampled = pick(port, f"00-{TRACE_ID}-{PARENT}-01")
            picked = {h.header.key: h.header.raw_value.decode()
                      for h in sampled.request_headers.response.header_mutation.set_headers}["x-gateway-destination-endpoint"]
            assert unsampled.request_headers.response.header_mutation.set_headers
            until(lambda: collector.spans, "the pick's span reaches the collector", timeout=20)
    finally:
        collector.stop()
    (service, span), = collector.spans
    attrs = {a.key: a.value for a in span.attributes}
    assert service == "dlb-epp-pool" and span.name == "dlb.epp.pick"
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT
    assert attrs["dlb.server"].string_value == picked and attrs["dlb.pool"].string_value == "pool"
    assert attrs["dlb.server.rif"].int_value == 1 and span.end_time_unix_nano >= span.start_time_unix_nano
