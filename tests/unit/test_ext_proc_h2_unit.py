"""DLB's HTTP/2 gRPC transport (:mod:`dlb.transport.h2`) against independent peers.

Here: the tests that run in-process (no sockets, no processes);
the others: ``tests/integration/test_ext_proc_h2.py``.
The rules and what the tests stand for: that file's docstring.
"""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ext_proc_h2 import METHOD

from dlb.transport.h2 import CachingDecoder

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
        assert list(plain.header_table.dynamic_entries) == list(cached.decoder.entries)


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
