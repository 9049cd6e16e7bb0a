"""What a fresh ``traceparent`` per ext_proc call costs DLB's HTTP/2 transport in header decoding.

Why: with its tracer on, Envoy sends a ``traceparent`` in every ext_proc call's gRPC metadata and its
HPACK encoder indexes it, so no header block repeats and the transport's exact-block cache never hits.
This replays the header blocks a real Envoy sent the traced root (``tests/fixtures/
envoy_traced_header_blocks.txt``: one connection, in order) through the old decoding path (``hpack.Decoder``
then ``parse_head``, what every block cost before ``hpack_decoder``) and through the transport's
:class:`CachingDecoder`, alternating the two over ROUNDS rounds, and prints CPU µs per block
(``time.process_time``: the box is shared) as the median and the minimum over rounds. Also untraced
steady blocks (the same call head with no ``traceparent``: cache hits, as before) for scale.

    .venv/bin/python research/tools/hpack_traceparent.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hpack

from dlb.transport.headers import CachingDecoder, parse_head

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "envoy_traced_header_blocks.txt"
UNTRACED = [(":method", "POST"), (":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
            (":authority", "dlb_root_ext_proc"), (":scheme", "http"), ("te", "trailers"),
            ("content-type", "application/grpc"), ("x-dlb-endpoint", "chat"), ("x-envoy-internal", "true"),
            ("x-forwarded-for", "192.0.2.2")]


def envoy_blocks() -> list[bytes]:
    return [bytes.fromhex(line) for line in FIXTURE.read_text().splitlines() if line and not line.startswith("#")]


def old_path(blocks: list[bytes]) -> None:
    dec = hpack.Decoder()
    for b in blocks:
        parse_head(dec.decode(b, raw=True))


def new_path(blocks: list[bytes]) -> None:
    dec = CachingDecoder(65536)
    for b in blocks:
        dec.decode_head(b)


def per_block_us(run: Callable[[list[bytes]], None], blocks: list[bytes], replays: int) -> float:
    """``blocks`` decoded in order by a fresh decoder, ``replays`` times (a sequence is one connection's)."""
    t0 = time.process_time()
    for _ in range(replays):
        run(blocks)
    return (time.process_time() - t0) / (len(blocks) * replays) * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    traced = envoy_blocks()  # the fixture's 250 calls, replayed 8 times per round
    enc = hpack.Encoder()
    first = enc.encode(UNTRACED)  # adds the entries; from then on indexed only, the block Envoy repeats
    steady = [first] + [enc.encode(UNTRACED)] * 249
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, run, blocks in (("traced, hpack + parse_head (old)", old_path, traced),
                                  ("traced, CachingDecoder (new)", new_path, traced),
                                  ("untraced, CachingDecoder (new)", new_path, steady)):
            times.setdefault(name, []).append(per_block_us(run, blocks, 8))
    for name, xs in times.items():
        print(f"{name:<36} median {statistics.median(xs):7.2f} us per block, min {min(xs):7.2f}  ({rounds} rounds)")


if __name__ == "__main__":
    main()
