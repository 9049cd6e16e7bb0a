"""The transport's HPACK decoder (:mod:`dlb.transport.hpack_decoder`) against RFC 7541 and ``hpack``.

Rules: every block decodes to the fields RFC 7541 Appendix C gives and leaves the table it gives; any
block (encoded or garbage) gives what ``hpack.Decoder`` gives — the same fields and dynamic table, or
the same exception class; the blocks a real traced Envoy sent decode as ``hpack`` decodes them; each
bound (header list, table size, integer length, truncation, Huffman padding) is an error. And the
comparisons can fail: a decoder with a wrong entry size or a wrong Huffman entry is caught.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import hpack
import hpack.exceptions as hx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlb.transport import hpack_decoder, huffman
from dlb.transport.headers import CachingDecoder, parse_head
from dlb.transport.hpack_decoder import Decoder
from dlb.transport.huffman import decode_huffman

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "envoy_traced_header_blocks.txt"
ENVOY_BLOCKS = [bytes.fromhex(line) for line in FIXTURE.read_text().splitlines() if line and not line.startswith("#")]

# RFC 7541 Appendix C: C.3/C.4 requests (table 4,096; plain / Huffman), C.5/C.6 responses (table 256:
# entries are evicted; plain / Huffman). Each block with its fields and the table's size after it.
_DATE1, _DATE2 = b"Mon, 21 Oct 2013 20:13:21 GMT", b"Mon, 21 Oct 2013 20:13:22 GMT"
_REQ = [[(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
        [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com"),
         (b"cache-control", b"no-cache")],
        [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"), (b":authority", b"www.example.com"),
         (b"custom-key", b"custom-value")]]
_RESP = [[(b":status", b"302"), (b"cache-control", b"private"), (b"date", _DATE1), (b"location", b"https://www.example.com")],
         [(b":status", b"307"), (b"cache-control", b"private"), (b"date", _DATE1), (b"location", b"https://www.example.com")],
         [(b":status", b"200"), (b"cache-control", b"private"), (b"date", _DATE2), (b"location", b"https://www.example.com"),
          (b"content-encoding", b"gzip"), (b"set-cookie", b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")]]
RFC_C = {
    "C.3": (4096, _REQ, [57, 110, 164], ["828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
                                         "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"]),
    "C.4": (4096, _REQ, [57, 110, 164], ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf",
                                         "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"]),
    "C.5": (256, _RESP, [222, 222, 215], [
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d546e1768747470"
        "733a2f2f7777772e6578616d706c652e636f6d",
        "4803333037c1c0bf",
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f3d4153444a4b"
        "48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076657273696f6e3d31"]),
    "C.6": (256, _RESP, [222, 222, 215], [
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f0b97c8e9ae82ae43d3",
        "4883640effc1c0bf",
        "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335dfdfcd5b3960d5af2708"
        "7f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007"]),
}
# C.2: single representations on an empty table (literal indexed / not indexed / never indexed, indexed).
RFC_C2 = [("400a637573746f6d2d6b65790d637573746f6d2d686561646572", [(b"custom-key", b"custom-header")], 55),
          ("040c2f73616d706c652f70617468", [(b":path", b"/sample/path")], 0),
          ("100870617373776f726406736563726574", [(b"password", b"secret")], 0),
          ("82", [(b":method", b"GET")], 0)]


def rfc_mismatches() -> list[str]:
    """Where the decoder departs from Appendix C (empty when it follows it)."""
    out = []
    for name, (table, fields, sizes, blocks) in RFC_C.items():
        dec = Decoder(65536, max_table_size=table)
        for i, (want, size, block) in enumerate(zip(fields, sizes, blocks, strict=True)):
            got = dec.decode(bytes.fromhex(block))
            if got != want or dec.size != size:
                out.append(f"{name}.{i + 1}: {got} size {dec.size}")
    for block, want, size in RFC_C2:
        dec = Decoder(65536)
        if dec.decode(bytes.fromhex(block)) != want or dec.size != size:
            out.append(f"C.2 {block}")
    return out


def outcome(decode: Callable[[bytes], list[tuple[bytes, bytes]]], block: bytes) -> object:
    try:
        return [(bytes(k), bytes(v)) for k, v in decode(block)]
    except hx.HPACKError as e:
        return type(e)


def first_difference(blocks: list[bytes], ours: Decoder | None = None) -> int | None:
    """The first block of a sequence on which our decoder and ``hpack`` disagree (fields, table or error)."""
    ref, ours = hpack.Decoder(), ours or Decoder(65536)
    for i, block in enumerate(blocks):
        want, got = outcome(lambda b: ref.decode(b, raw=True), block), outcome(ours.decode, block)
        if want != got:
            return i
        if isinstance(want, type):  # both refused it: the connection would be lost, the tables unknown
            return None
        if list(ref.header_table.dynamic_entries) != list(ours.entries) or ref.header_table._current_size != ours.size:
            return i
    return None


def test_rfc_7541_appendix_c() -> None:
    """Requests and responses, plain and Huffman, with eviction at a 256-byte table: fields and sizes as printed."""
    assert rfc_mismatches() == []


def test_the_blocks_envoy_sent_with_tracing_on_decode_as_hpack_decodes_them() -> None:
    """250 calls of one real connection (a new indexed traceparent each, the table cycling through evictions)."""
    assert first_difference(ENVOY_BLOCKS) is None
    dec = Decoder(65536)
    heads = [dict(dec.decode(b)) for b in ENVOY_BLOCKS]
    assert all(h[b":path"] == b"/envoy.service.ext_proc.v3.ExternalProcessor/Process" for h in heads)
    assert len({h[b"traceparent"] for h in heads}) == len(heads)


_names = st.one_of(st.sampled_from([b":path", b":authority", b"content-type", b"traceparent", b"x-a", b"X-Up"]),
                   st.binary(max_size=12))
_values = st.one_of(st.sampled_from([b"", b"chat", b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"]), st.binary(max_size=300))
_fields = st.lists(st.tuples(_names, _values, st.sampled_from(["index", "never"])), min_size=1, max_size=8)


@FUZZ
@given(st.lists(st.tuples(_fields, st.booleans(), st.sampled_from([None, 0, 100, 256, 4096])), min_size=1, max_size=12))
def test_encoded_blocks_decode_as_hpack_decodes_them(blocks) -> None:
    """hpack's encoder (indexing or not, Huffman or not, table size updates incl. 0) then both decoders."""
    enc = hpack.Encoder()
    seq = []
    for fields, huff, table_size in blocks:
        if table_size is not None:
            enc.header_table_size = table_size
        tuples = [hpack.HeaderTuple(k, v) if how == "index" else hpack.NeverIndexedHeaderTuple(k, v) for k, v, how in fields]
        seq += [enc.encode(tuples, huffman=huff)] * 2  # the second time mostly indexed fields
    assert first_difference(seq) is None


@FUZZ
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=4))
def test_garbage_decodes_as_hpack_decodes_it(blocks) -> None:
    """Arbitrary bytes: the same fields and table, or the same exception class."""
    assert first_difference(blocks) is None


@FUZZ
@given(st.binary(max_size=60))
def test_huffman_strings_decode_as_hpack_decodes_them(data: bytes) -> None:
    from hpack.huffman_table import decode_huffman as ref

    enc = hpack.huffman.HuffmanEncoder(hpack.huffman_constants.REQUEST_CODES, hpack.huffman_constants.REQUEST_CODES_LENGTH)
    assert decode_huffman(enc.encode(data)) == data
    assert outcome(lambda b: [(b"", decode_huffman(b))], data) == outcome(lambda b: [(b"", ref(b))], data)


def test_every_bound_is_an_error() -> None:
    def fails(block: bytes, error: type[Exception], dec: Decoder | None = None) -> None:
        with pytest.raises(error):
            (dec or Decoder(65536)).decode(block)

    big = hpack.Encoder().encode([(b"x-a", b"v" * 200)], huffman=False)
    fails(big, hx.OversizedHeaderListError, Decoder(200))  # 3 + 200 + 32 > 200
    assert Decoder(235).decode(big) == [(b"x-a", b"v" * 200)]  # exactly at the bound
    fails(b"\x3f\xe2\x1f", hx.InvalidTableSizeError)  # a size update to 4,097 > our 4,096
    fails(b"\x82\x20", hx.HPACKDecodingError)  # a size update after a field
    fails(b"\x80", hx.InvalidTableIndex)  # index 0
    fails(b"\xbe", hx.InvalidTableIndex)  # index 62 on an empty dynamic table
    fails(b"\xff\x80\x80\x80\x80\x80\x01", hx.HPACKDecodingError)  # an integer with 6 continuation bytes
    fails(b"\x04\x05ab", hx.HPACKDecodingError)  # a value shorter than its length
    fails(b"\x04\x81\x00", hx.HPACKDecodingError)  # Huffman: padding of zeros
    fails(b"\x04\x82\x1f\xff", hx.HPACKDecodingError)  # Huffman: 'a' then 11 bits of padding
    fails(b"\x04\x84\xff\xff\xff\xff", hx.HPACKDecodingError)  # Huffman: the EOS symbol
    assert Decoder(65536).decode(b"\x04\x81\x1f") == [(b":path", b"a")]  # 'a' (00011) then 3 ones


def test_a_size_update_evicts_and_an_oversized_entry_empties_the_table() -> None:
    dec = Decoder(65536)
    dec.decode(hpack.Encoder().encode([(b"x-a", b"1"), (b"x-b", b"2")], huffman=False))
    assert dec.entries == type(dec.entries)([(b"x-b", b"2"), (b"x-a", b"1")]) and dec.size == 72
    dec.decode(b"\x3f\x17")  # size update to 54: the older entry goes
    assert list(dec.entries) == [(b"x-b", b"2")] and dec.size == 36
    dec.decode(b"\x40\x03x-c\x20" + b"v" * 32)  # 3 + 32 + 32 > 54: everything goes, nothing is added
    assert list(dec.entries) == [] and dec.size == 0


def test_repeated_unindexed_strings_come_from_the_memo_and_stay_exact() -> None:
    """The memo is keyed by the coded bytes, so a different string is never served from it."""
    dec = Decoder(65536)
    enc = hpack.Encoder()
    for _ in range(3):
        a = os.urandom(8).hex().encode()
        block = enc.encode([hpack.NeverIndexedHeaderTuple(b":path", b"/p/" + a), hpack.NeverIndexedHeaderTuple(b":path", b"/same")])
        assert dec.decode(block) == [(b":path", b"/p/" + a), (b":path", b"/same")]
    with pytest.raises(hx.HPACKDecodingError):
        dec.decode(b"\x04\x81\x00")  # refused every time, never remembered
    with pytest.raises(hx.HPACKDecodingError):
        dec.decode(b"\x04\x81\x00")


def test_the_comparisons_catch_a_wrong_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder whose entries are one byte smaller evicts late; one whose Huffman table reads 'w' as 'v'
    decodes "www.example.com" wrong: the Envoy replay and Appendix C each fail on them."""
    monkeypatch.setattr(hpack_decoder, "ENTRY_OVERHEAD", 31)
    assert first_difference(ENVOY_BLOCKS) is not None
    assert rfc_mismatches()
    monkeypatch.undo()
    emit = [e.replace(b"w", b"v") for e in huffman.EMIT]  # 'w' read as 'v' wherever a byte completes it
    hpack_decoder._memo_huffman.cache_clear()
    try:
        monkeypatch.setattr(huffman, "EMIT", emit)
        assert any("C.4" in m or "C.6" in m for m in rfc_mismatches())
    finally:
        monkeypatch.undo()
        hpack_decoder._memo_huffman.cache_clear()
    assert rfc_mismatches() == [] and first_difference(ENVOY_BLOCKS) is None


def test_envoys_traced_blocks_go_through_the_shifted_template_and_give_the_same_heads() -> None:
    """After the first calls (and after each refresh of the evicted fixed entries) a traced call's block
    is the last one with its dynamic indices moved by one: only its traceparent is decoded, and the head
    the transport builds from the template is the head ``parse_head`` builds from the fields."""
    cache = CachingDecoder(65536)
    shifted = 0
    for block in ENVOY_BLOCKS:
        head = cache.decode_head(block)
        shifted += cache.decoder.used is not None
        assert head == parse_head(head.fields) and head.traceparent == dict(head.fields)[b"traceparent"]
    assert shifted >= 230  # 236 of 250 on the recorded connection
    assert first_difference(ENVOY_BLOCKS) is None


def _envoy_like(table_size: int, values: list[bytes], extra: bool) -> list[bytes]:
    """Calls the way Envoy encodes them: fixed fields indexed, one new indexed traceparent each, at a
    small table (entries the next block names get evicted; the encoder then sends them again)."""
    enc = hpack.Encoder()
    enc.header_table_size = table_size
    fixed = [(b":method", b"POST"), (b":authority", b"dlb_root_ext_proc"), (b"content-type", b"application/grpc")]
    after = [(b"x-envoy-internal", b"true"), (b"x-forwarded-for", b"192.0.2.2")] + ([(b"x-b", b"b" * 40)] if extra else [])
    path = hpack.NeverIndexedHeaderTuple(b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process")
    return [enc.encode([*fixed[:1], path, *fixed[1:], (b"traceparent", v), *after]) for v in values]


_traceparents = st.lists(st.binary(min_size=0, max_size=70), min_size=2, max_size=40)


@FUZZ
@given(st.sampled_from([4096, 512, 300, 200]), _traceparents, st.booleans())
def test_envoy_like_calls_decode_as_hpack_decodes_them(table_size: int, values: list[bytes], extra: bool) -> None:
    assert first_difference(_envoy_like(table_size, values, extra)) is None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 249), st.integers(-3, 3), st.integers(0, 300), st.integers(0, 255),
                          st.booleans()), min_size=1, max_size=25))
def test_near_copies_of_envoys_blocks_decode_as_hpack_decodes_them(ops) -> None:
    """The recorded blocks with every dynamic index moved, a byte changed or the block cut short: whatever
    the shifted template takes or refuses, the fields, table and errors are ``hpack``'s."""
    seq = ENVOY_BLOCKS[:3]
    for i, shift, at, byte, cut in ops:
        b = bytearray(x + shift if 0xBE <= x <= 0xFE and 0xBE <= x + shift <= 0xFE else x for x in ENVOY_BLOCKS[i])
        if cut:
            b = b[:at % (len(b) + 1)]
        else:
            b[at % len(b)] = byte
        seq.append(bytes(b))
    assert first_difference(seq) is None


def test_a_template_naming_an_entry_its_own_insertion_evicted_is_decoded_in_full() -> None:
    """A block equal to the template with its indices moved, whose suffix names the entry the new
    literal evicts: hpack refuses it (the index is past the table), and so do we, after the insertion."""
    small = b"\x3f\x81\x01"  # table size 160
    first = small + b"\x40\x03x-a\x01a" + b"\x40\x03x-b\x01b"  # x-a, x-b: 72 bytes
    call = b"\x40\x03x-t\x0a" + b"t" * 10 + b"\xc0"  # x-t (45 bytes) then index 64: x-a, the oldest
    # x-t, x-b, x-a (117 bytes); then x-t again: 162 > 160 evicts x-a, which index 64 + 1 would name.
    seq = [first, call, call.replace(b"\xc0", b"\xc1")]
    assert first_difference(seq) is None
    dec = Decoder(65536)
    for b in seq[:2]:
        dec.decode(b)
    with pytest.raises(hx.InvalidTableIndex):
        dec.decode(seq[2])
