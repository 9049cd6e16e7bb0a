"""CPU per ext_proc call of the root's HTTP/2 transport, with and without Envoy's per-call ``traceparent``.

Why: on a loaded box ``dlb bench overhead`` cannot resolve a few per cent; this isolates what tracing
adds to the transport. It replays the header blocks a real traced Envoy sent (``tests/fixtures/
envoy_traced_header_blocks.txt``, one connection's 250 calls, each with a new indexed ``traceparent``)
or the untraced call head (the same fields less the trace ones, indexed: the block Envoy repeats), each
call a HEADERS frame and a DATA frame with one gRPC message, into :class:`H2Connection` with a constant
handler, and prints CPU µs per call (``time.process_time``), median and minimum over ROUNDS rounds that
alternate the two. Run it against another checkout with ``PYTHONPATH=that/checkout``.

    .venv/bin/python research/tools/h2_traced_calls.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import struct
import sys
import time
from pathlib import Path

import hpack

import dlb
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.transport.h2 import PREFACE, H2Connection
from dlb.transport.limits import TransportStats

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "envoy_traced_header_blocks.txt"
UNTRACED = [(":method", "POST"), (":path", PROCESS_METHOD), (":authority", "dlb_root_ext_proc"), (":scheme", "http"),
            ("te", "trailers"), ("content-type", "application/grpc"), ("x-dlb-endpoint", "chat"),
            ("x-envoy-internal", "true"), ("x-forwarded-for", "192.0.2.2")]
MESSAGE = b"\x00" + struct.pack(">I", 64) + b"m" * 64  # one gRPC message (its content is not parsed here)


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def calls(blocks: list[bytes]) -> list[bytes]:
    """Each call's bytes: HEADERS (END_HEADERS) on a new stream, then DATA (END_STREAM); a connection
    window update every 100 calls keeps replies flowing."""
    out = []
    for i, block in enumerate(blocks):
        sid = 2 * i + 1
        data = frame(0x1, 0x4, sid, block) + frame(0x0, 0x1, sid, MESSAGE)
        if i % 100 == 0:
            data += frame(0x8, 0, 0, struct.pack(">I", 1 << 20))
        out.append(data)
    return out


def per_call_us(per_call: list[bytes], connections: int) -> float:
    start = PREFACE + frame(0x4, 0, 0)  # preface + empty SETTINGS
    t0 = time.process_time()
    for _ in range(connections):
        conn = H2Connection(PROCESS_METHOD.encode(), lambda m: (b"reply", True), TransportStats())
        conn.initiate()
        conn.receive_data(start)
        conn.data_to_send()
        for data in per_call:
            conn.receive_data(data)
            conn.data_to_send()
    return (time.process_time() - t0) / (connections * len(per_call)) * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    traced = [bytes.fromhex(x) for x in FIXTURE.read_text().splitlines() if x and not x.startswith("#")]
    enc = hpack.Encoder()
    untraced = [enc.encode(UNTRACED) for _ in traced]  # the first adds the entries, the rest repeat
    sets = {"untraced": calls(untraced), "traced": calls(traced)}
    times: dict[str, list[float]] = {k: [] for k in sets}
    for _ in range(rounds):
        for name, per_call in sets.items():
            times[name].append(per_call_us(per_call, 8))
    print(f"dlb from {Path(dlb.__file__).parent}")
    for name, xs in times.items():
        print(f"{name:<9} median {statistics.median(xs):6.2f} us per call, min {min(xs):6.2f}  ({rounds} rounds)")
    added = [t - u for t, u in zip(times["traced"], times["untraced"], strict=True)]
    print(f"traced - untraced, per round: median {statistics.median(added):6.2f} us, min {min(added):6.2f}")


if __name__ == "__main__":
    main()
