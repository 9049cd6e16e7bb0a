"""A real OTLP/gRPC trace receiver, in process: where tests and ``dlb bench overhead`` send spans.

Why our own: the point is to see what DLB and its Envoys export on the wire (the collector protocol, not
a mocked SDK), with nothing to install. It keeps every span (tests read them) or, for a benchmark, only
counts them so a long run holds no memory.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Receives ``Export`` calls on 127.0.0.1; ``spans`` holds ``(service.name, span)`` pairs when ``keep``."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[tuple[str, Any]] = []
        self.count = 0
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)

    def start(self) -> int:
        """Serve on 127.0.0.1; returns the port."""
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return port

    def stop(self) -> None:
        self.server.stop(None)

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        with self.lock:
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.count += len(ss.spans)
                    if self.keep:
                        self.spans += [(service, s) for s in ss.spans]
        return trace_service_pb2.ExportTraceServiceResponse()
