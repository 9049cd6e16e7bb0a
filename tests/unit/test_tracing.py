"""Tracing's sampling and the root-decision span, in process (an in-memory exporter: no collector)."""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_ext_proc_root import probe, service

from dlb.ext_proc.tracing import describe_root, traced, unsampled
from dlb.service.tracing import Tracer, TracingOptions

TRACE, PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def tracer(ratio: float) -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return Tracer(TracingOptions("unused:4317", ratio), exporter=exporter), exporter


def test_the_parents_flag_decides_and_the_ratio_only_without_one():
    t, _ = tracer(0.0)
    assert t.sampled(f"00-{TRACE}-{PARENT}-01") and not t.sampled(f"00-{TRACE}-{PARENT}-00")
    assert not t.sampled(None) and not t.sampled("garbage")  # no valid parent: the ratio (0)
    assert tracer(1.0)[0].sampled("garbage")
    t, _ = tracer(0.25)
    assert 0.2 < sum(t.sampled(None) for _ in range(4000)) / 4000 < 0.3


def headers(traceparent: str | None) -> bytes:
    hs = [(":path", "/v1/chat/completions"), *([("traceparent", traceparent)] if traceparent else [])]
    return ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs]))).SerializeToString()


def test_a_sampled_decision_becomes_a_child_span_naming_the_cell_costs_and_aversion():
    svc, clock = service()
    for j in range(2):
        probe(svc, j, clock.t)
    t, exporter = tracer(0.0)
    handle = traced(svc.handle, t, "dlb.root.decide", describe_root(svc))
    untraced, _ = svc.handle(headers(None))
    reply, end = handle(headers(f"00-{TRACE}-{PARENT}-01"))
    assert reply == untraced and end  # the wrapper changes no answer
    handle(headers(f"00-{TRACE}-{PARENT}-00"))
    handle(headers(None))
    t.shutdown()
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == TRACE and f"{span.parent.span_id:016x}" == PARENT
    attrs = dict(span.attributes or {})
    assert attrs["dlb.cell"] == "a" and attrs["dlb.endpoint"] == "chat" and attrs["dlb.policy"] == "Disc-Lat"
    assert attrs["dlb.cost.a"] < attrs["dlb.cost.b"] and attrs["dlb.aversion.b"] == 0.0


def test_an_unsampled_parent_is_read_off_the_bytes_only_when_the_tracer_would_say_so():
    """``unsampled`` (the wrapper's shortcut for Envoy's 99 %) never claims a parent the tracer would sample
    or judge by the ratio: a sampled flag, another version, a malformed shape all go to the tracer."""
    t, _ = tracer(1.0)  # the ratio samples everything: any False below is the parent's flag
    tp = f"00-{TRACE}-{PARENT}-00".encode()
    assert unsampled(tp) and not t.sampled(tp.decode())
    for other in (f"00-{TRACE}-{PARENT}-01", f"01-{TRACE}-{PARENT}-00", f" 0-{TRACE}-{PARENT}-00",
                  f"00-{TRACE[:-1]}--{PARENT}-00", f"00-{TRACE}-{PARENT}-00 ", "00-00"):
        assert not unsampled(other.encode())
