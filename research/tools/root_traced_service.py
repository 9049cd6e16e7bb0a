"""CPU per ext_proc call of a real ``dlb serve root`` process, traced or not, fed Envoy's recorded call heads.

Why: ``dlb bench overhead --configs root root-traced`` shows what tracing adds to the root service
(+32 µs per request on a quiet box) but not where it goes, and ``h2_traced_calls.py`` (the transport
alone, in one tight loop) finds less than half of it. This drives the real service process over a real
socket, one call at a time at an open-loop RATE (as Envoy's calls arrive), and reads the service's CPU
(schedstat, all its threads: the span exporter's included). Four runs, alternated ROUNDS times:

- ``plain``: untraced service, the untraced call head (the block Envoy repeats): the bench's ``root``;
- ``tp-only``: untraced service, Envoy's traced call heads (``tests/fixtures/envoy_traced_header_blocks.txt``,
  a new indexed ``traceparent`` per call): what the transport pays for Envoy's tracer;
- ``traced``: service with ``--otlp-endpoint`` (1 %, a real collector in this process) and the traced
  heads: the bench's ``root-traced``;
- ``svc-only``: the traced service and the untraced head (its own 1 % ratio decides).

Each call is a HEADERS and a DATA frame (a real ``request_headers`` message) on a new stream; the
fixture is one connection's 250 calls, so every 250 calls the connection is replaced (in all runs).

    .venv/bin/python research/tools/root_traced_service.py [--rate 1500] [--seconds 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

import hpack
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from dlb.bench.overhead import _cpu_of, bench_config
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.testbed.otlp_collector import Collector
from dlb.testbed.process import ServiceProcess, free_port
from dlb.transport.h2 import PREFACE

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "envoy_traced_header_blocks.txt"
UNTRACED = [(":method", "POST"), (":path", PROCESS_METHOD), (":authority", "dlb_root_ext_proc"), (":scheme", "http"),
            ("te", "trailers"), ("content-type", "application/grpc"), ("x-dlb-endpoint", "chat"),
            ("x-envoy-internal", "true"), ("x-forwarded-for", "192.0.2.2")]
HEADERS = [(":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "localhost"), (":scheme", "http"),
           ("content-type", "application/json"), ("x-request-id", "0b6c3c53-6f1e-4a5e-9d59-6e3a4c2f1a7b"),
           ("x-forwarded-proto", "http"), ("x-dlb-endpoint", "chat")]


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def message() -> bytes:
    msg = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in HEADERS]))).SerializeToString()
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass


def run(port: int, blocks: list[bytes], rate: float, seconds: float, pid: int) -> tuple[float, int]:
    """Calls at ``rate`` for ``seconds``; the service's CPU µs per call and the number of calls."""
    msg = message()
    interval = 1.0 / rate
    calls = 0
    cpu0 = _cpu_of(pid)
    t0 = time.monotonic()
    deadline = t0 + seconds
    next_at = t0
    while time.monotonic() < deadline:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = threading.Thread(target=drain, args=(sock,), daemon=True)
        reader.start()
        sock.sendall(PREFACE + frame(0x4, 0, 0) + frame(0x4, 0x1, 0) + frame(0x8, 0, 0, struct.pack(">I", 1 << 24)))
        for i, block in enumerate(blocks):
            now = time.monotonic()
            if now >= deadline:
                break
            if next_at > now:
                time.sleep(next_at - now)
            next_at += interval
            sid = 2 * i + 1
            sock.sendall(frame(0x1, 0x4, sid, block) + frame(0x0, 0x1, sid, msg))
            calls += 1
        time.sleep(0.02)  # the last replies
        sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
        sock.close()
        reader.join(1)
    time.sleep(0.05)
    return (_cpu_of(pid) - cpu0) / calls * 1e6, calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=1500.0)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    traced_blocks = [bytes.fromhex(x) for x in FIXTURE.read_text().splitlines() if x and not x.startswith("#")]
    enc = hpack.Encoder()
    plain_blocks = [enc.encode(UNTRACED) for _ in traced_blocks]
    collector = Collector(keep=False)
    otlp = collector.start()
    with tempfile.TemporaryDirectory() as d:
        raw = bench_config(free_port())
        cfg = Path(d) / "dlb.yaml"
        cfg.write_text(json.dumps(raw))
        leaf = ServiceProcess("leaf", "--config", str(cfg), "--cell", "x", "--metrics", "", "--scrape-period-ms", "0",
                              "--envoy-check-period-ms", "0").start()
        plain = ServiceProcess("root", "--config", str(cfg), "--cell", "x", "--listen", "127.0.0.1:0", "--metrics", "").start()
        traced = ServiceProcess("root", "--config", str(cfg), "--cell", "x", "--listen", "127.0.0.1:0", "--metrics", "",
                                "--otlp-endpoint", f"127.0.0.1:{otlp}", "--trace-sample-ratio", "0.01").start()
        try:
            time.sleep(3)  # probes answered, the cell routable
            runs = {"plain": (plain, plain_blocks), "tp-only": (plain, traced_blocks),
                    "traced": (traced, traced_blocks), "svc-only": (traced, plain_blocks)}
            out: dict[str, list[float]] = {k: [] for k in runs}
            rates: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.rounds):
                for name, (svc, blocks) in runs.items():
                    us, n = run(svc.ready["ext_proc"], blocks, args.rate, args.seconds, svc.ready["pid"])
                    out[name].append(us)
                    rates[name].append(n / args.seconds)
            print(f"rate {args.rate:g}/s, {args.seconds:g} s per run, {args.rounds} rounds; spans collected {collector.count}")
            base = statistics.median(out["plain"])
            for name, xs in out.items():
                m = statistics.median(xs)
                runs_txt = " ".join(f"{x:.1f}" for x in xs)
                print(f"{name:<9} median {m:6.1f} us CPU per call (+{m - base:5.1f}), runs {runs_txt}, "
                      f"calls/s {min(rates[name]):.0f}-{max(rates[name]):.0f}")
        finally:
            for s in (traced, plain, leaf):
                s.stop()
            collector.stop()


if __name__ == "__main__":
    main()
