"""What a fresh ``traceparent`` per ext_proc call costs DLB's HTTP/2 transport in header decoding.

Why: with its tracer on, Envoy sends a ``traceparent`` in every ext_proc call's gRPC metadata and its
HPACK encoder indexes it, so no header block repeats and the transport's exact-block cache never hits.
This encodes Envoy-shaped ext_proc call heads with ``hpack`` (incremental indexing, as Envoy's encoder
does) and times :class:`CachingDecoder.decode_head` on them, with and without the per-call field.

    .venv/bin/python research/tools/hpack_traceparent.py [CALLS]
"""

from __future__ import annotations

import os
import sys
import time

import hpack

from dlb.ext_proc.transport.headers import CachingDecoder

HEAD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
        (b":authority", b"dlb_root_ext_proc"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        (b"grpc-timeout", b"200m"), (b"x-envoy-internal", b"true"), (b"x-forwarded-for", b"127.0.0.1")]


def per_call_us(calls: int, traced: bool) -> tuple[float, int]:
    """Mean decode time per call head (µs) and the cache's hits."""
    enc, dec = hpack.Encoder(), CachingDecoder(65536)
    blocks = []
    for _ in range(calls):
        fields = list(HEAD)
        if traced:
            fields.append((b"traceparent", b"00-" + os.urandom(16).hex().encode() + b"-" + os.urandom(8).hex().encode() + b"-00"))
        blocks.append(enc.encode(fields))
    t0 = time.perf_counter()
    for b in blocks:
        dec.decode_head(b)
    return (time.perf_counter() - t0) / calls * 1e6, dec.hits


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    for traced in (False, True):
        us, hits = per_call_us(calls, traced)
        print(f"traceparent per call: {traced!s:5}  {us:7.2f} us per head  cache hits {hits} of {calls}")


if __name__ == "__main__":
    main()
