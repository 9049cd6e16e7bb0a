"""DLB's HTTP/2 gRPC transport (:mod:`dlb.ext_proc.transport.h2`) against independent peers.

The ``h2`` library (python-hyper) plays the client for protocol corners a well-behaved gRPC client
never produces (CONTINUATION, padding, tiny flow-control windows, byte-by-byte delivery, bad
input); grpc's C-core client is the conformance check (``test_ext_proc_root.py``), and Envoy itself
is the peer in ``test_envoy_forwards_only_the_headers_the_root_reads`` and every end-to-end test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlb.ext_proc.health import HealthState, h2_health_routes
from dlb.ext_proc.protocol import PROCESS_METHOD
from dlb.ext_proc.transport.h2 import CachingDecoder
from dlb.ext_proc.transport.server import H2GrpcServer

METHOD = PROCESS_METHOD


class ServerThread:
    """An H2GrpcServer on its own event loop thread (the tests talk to it with blocking sockets)."""

    def __init__(self, handler, loop_factory=asyncio.new_event_loop) -> None:
        # With the health service, as ExtProcServer serves it: the rendered bootstraps health-check ext_proc.
        self.server = H2GrpcServer(METHOD, handler, routes=h2_health_routes(HealthState()))
        self.loop = loop_factory()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1", 0), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.5), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def echo_upper(message: bytes) -> tuple[bytes, bool]:
    """Replies the message upper-cased; ``b"keep..."`` keeps the call open, ``b"boom"`` raises."""
    if message == b"boom":
        raise RuntimeError("handler bug")
    return message.upper(), not message.startswith(b"keep")


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(echo_upper)
    try:
        yield s
    finally:
        s.close()


# -- the HPACK cache is exact --------------------------------------------------------------------
_names = st.sampled_from(["x-a", "x-b", "x-session-id", ":path", "content-type"])
_values = st.sampled_from(["1", "2", "chat", "a-long-value-" * 3, ""])
_header_lists = st.lists(st.tuples(_names, _values), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_header_lists, st.booleans(), st.sampled_from([None, 256, 4096])), min_size=1, max_size=25))
def test_caching_decoder_decodes_exactly_as_hpack(blocks):
    """Any sequence of blocks (indexed or not, with table size changes) decodes as hpack alone does."""
    enc = hpack.Encoder()
    plain, cached = hpack.Decoder(), CachingDecoder(1 << 20)
    for headers, sensitive, table_size in blocks:
        if table_size is not None:
            enc.header_table_size = table_size
        tuples = [hpack.HeaderTuple(k, v) if not sensitive else hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers]
        for _ in range(2):  # the same list again encodes as indexed fields: a block the cache may serve
            block = enc.encode(tuples)
            expect = [(bytes(k), bytes(v)) for k, v in plain.decode(block, raw=True)]
            got = [(bytes(k), bytes(v)) for k, v in cached.decode(block)]
            assert got == expect
        assert list(plain.header_table.dynamic_entries) == list(cached.decoder.header_table.dynamic_entries)


def test_caching_decoder_hits_on_envoys_steady_state_block():
    enc = hpack.Encoder()
    dec = CachingDecoder(1 << 20)
    headers = [(":method", "POST"), (":path", METHOD), ("content-type", "application/grpc"), ("x-dlb-endpoint", "chat")]
    first = enc.encode(headers)  # adds entries to the table: not cached
    dec.decode(first)
    again = enc.encode(headers)  # indexed only: the same bytes from now on
    for _ in range(3):
        assert dict(dec.decode(again))[b":path"] == METHOD.encode()
    assert dec.hits == 2


# -- Envoy as the peer ------------------------------------------------------------------------------
