"""Instructions per ext_proc call of the root service in process, traced or not (for ``valgrind --tool=callgrind``).

Why instructions: the box these are measured on is shared (load 5-15), which inflates CPU time
several-fold and unevenly; an instruction count of the same work is the same at any load. One run does
CONNECTIONS replays of Envoy's recorded traced call heads (``tests/fixtures/envoy_traced_header_blocks.txt``,
250 calls of one connection), or of the untraced head, through :class:`H2Connection` with the real
:class:`RootService` handler (wrapped by the tracing wrapper at 1 % with an in-memory exporter when
traced). The cost per call is the difference of two runs' totals over the difference of their calls:

    for n in 1 3; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python research/tools/traced_call_ir.py traced $n 2>&1 | grep Collected; done

Modes: ``plain`` (untraced heads, bare handler: the bench's ``root``), ``traced`` (traced heads, wrapped
handler: ``root-traced``), ``tp-only`` (traced heads, bare handler), ``blocks`` (the traced heads through
``CachingDecoder`` alone, per 250 blocks). Another checkout: ``PYTHONPATH=it``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hpack
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.bench.overhead import bench_config
from dlb.config import config_from_dict
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.ext_proc.root import RootService
from dlb.transport.h2 import PREFACE, H2Connection
from dlb.transport.limits import TransportStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h2_traced_calls import FIXTURE, UNTRACED, frame

HEADERS = [(":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "localhost"), (":scheme", "http"),
           ("content-type", "application/json"), ("x-request-id", "0b6c3c53-6f1e-4a5e-9d59-6e3a4c2f1a7b"),
           ("x-forwarded-proto", "http"), ("x-dlb-endpoint", "chat")]


def main() -> None:
    mode, connections = sys.argv[1], int(sys.argv[2])
    if mode == "blocks":  # the header blocks alone, through CachingDecoder, CONNECTIONS replays
        from dlb.transport.headers import CachingDecoder

        recorded = [bytes.fromhex(x) for x in FIXTURE.read_text().splitlines() if x and not x.startswith("#")]
        for _ in range(connections):
            dec = CachingDecoder(65536)
            for block in recorded:
                dec.decode_head(block)
        return
    raw = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in HEADERS]))).SerializeToString()
    message = b"\x00" + len(raw).to_bytes(4, "big") + raw
    traced = [bytes.fromhex(x) for x in FIXTURE.read_text().splitlines() if x and not x.startswith("#")]
    enc = hpack.Encoder()
    blocks = traced if mode in ("traced", "tp-only") else [enc.encode(UNTRACED) for _ in traced]
    svc = RootService.from_config(config_from_dict(bench_config(9)), "x")
    handle = svc.handle
    tracer = None
    if mode == "traced":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from dlb.ext_proc.tracing import describe_root
        from dlb.ext_proc.tracing import traced as wrap
        from dlb.service.tracing import Tracer, TracingOptions

        tracer = Tracer(TracingOptions("unused:4317", 0.01), exporter=InMemorySpanExporter())
        handle = wrap(svc.handle, tracer, "dlb.root.decide", describe_root(svc))
    calls = []
    for i, block in enumerate(blocks):
        sid = 2 * i + 1
        calls.append(frame(0x1, 0x4, sid, block) + frame(0x0, 0x1, sid, message)
                     + (frame(0x8, 0, 0, (1 << 20).to_bytes(4, "big")) if i % 100 == 0 else b""))
    for _ in range(connections):
        conn = H2Connection(PROCESS_METHOD.encode(), handle, TransportStats())
        conn.initiate()
        conn.receive_data(PREFACE + frame(0x4, 0, 0))
        conn.data_to_send()
        for data in calls:
            conn.receive_data(data)
            conn.data_to_send()
    if tracer is not None:
        tracer.shutdown()


if __name__ == "__main__":
    main()
