"""An HPACK decoder (RFC 7541): the peer's dynamic table and one header block at a time, no I/O.

Why not ``hpack.Decoder``: it spends ~50 µs of pure Python on an 11-field block (a function call,
a ``memoryview`` slice and a ``logging.debug`` per field, two tuple types per field), and when Envoy
traces, every ext_proc call's block is new (its ``traceparent`` is indexed, which shifts every
dynamic index), so the exact-block cache in ``headers`` never hits. This loop decodes the same block
in ~10 µs (``research/tools/hpack_traceparent.py``). It keeps ``hpack``'s bounds and its exception
classes, so a caller cannot tell them apart except by speed (``tests/unit/test_hpack_decoder.py``
checks every block against ``hpack`` and RFC 7541 Appendix C):

- the header list of a block is at most ``max_header_list_size`` (RFC 7541 §4.1 sizes);
- the dynamic table is at most ``max_table_size`` (our SETTINGS_HEADER_TABLE_SIZE, 4,096 by default:
  the server never sends it), a size update above it or after a field is an error;
- integers take at most 5 continuation bytes, strings no more than the block holds, Huffman strings
  end in at most 7 bits of padding (``huffman``).
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

from hpack.exceptions import HPACKDecodingError, InvalidTableIndex, InvalidTableSizeError, OversizedHeaderListError
from hpack.table import HeaderTable

from dlb.transport.huffman import decode_huffman

Field = tuple[bytes, bytes]

#: RFC 7541 Appendix A, 1-based (index 0 is not a field).
STATIC: tuple[Field, ...] = (b"", b""), *HeaderTable.STATIC_TABLE
STATIC_LAST = len(STATIC) - 1  # 61
ENTRY_OVERHEAD = 32  # §4.1: an entry's size is its name and value plus 32
DEFAULT_TABLE_SIZE = 4096
#: Coded strings of fields the encoder chose not to index, remembered decoded (process-wide, exact:
#: Huffman decoding depends on nothing else). Envoy sends ``:path`` so on every call: 37 coded bytes,
#: ~5 µs each time. Bounded: 256 strings of at most 256 coded bytes (~200 KB at most).
MEMO_STRINGS = 256
MEMO_MAX_CODED = 256
_memo_huffman = lru_cache(maxsize=MEMO_STRINGS)(decode_huffman)


def _integer(block: bytes, pos: int, value: int) -> tuple[int, int]:
    """The rest of an integer whose prefix was full (``value`` = the prefix's maximum), §5.1."""
    shift = 0
    while True:
        if pos >= len(block):
            raise HPACKDecodingError("Truncated integer")
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 28:  # 5 continuation bytes at most, as hpack
            raise HPACKDecodingError("Variable integer representation is too long")


def _string(block: bytes, pos: int, memo: bool = False) -> tuple[bytes, int]:
    """A string literal (§5.2): its bytes and where the next representation starts (``memo``: through
    the memo of repeated coded strings)."""
    if pos >= len(block):
        raise HPACKDecodingError("Truncated header block")
    first = block[pos]
    length = first & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _integer(block, pos, length)
    end = pos + length
    if end > len(block):
        raise HPACKDecodingError("Truncated header block")
    raw = block[pos:end]
    if not first & 0x80:
        return raw, end
    return (_memo_huffman(raw) if memo and length <= MEMO_MAX_CODED else decode_huffman(raw)), end


class Decoder:
    """One connection's HPACK decoding context: ``decode(block)`` returns the block's fields in order."""

    def __init__(self, max_header_list_size: int, max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_table_size = max_table_size  # what the peer may set the table to (our SETTINGS)
        self.entries: deque[Field] = deque()  # the dynamic table, newest first (index 62 = entries[0])
        self.size = 0  # §4.1 size of the entries
        self.table_size = max_table_size  # the peer's current maximum (§6.3 updates it)
        self.changes = 0  # count of insertions and size updates: a block that leaves it alone changed nothing

    def decode(self, block: bytes) -> list[Field]:
        """The fields of one complete header block; HPACKDecodingError (or a subclass) when it is not
        valid HPACK or exceeds a bound: the connection's table is then unknown and the connection lost."""
        fields: list[Field] = []
        put = fields.append
        listed = 0
        limit = self.max_header_list_size
        entries = self.entries
        pos, end = 0, len(block)
        while pos < end:
            first = block[pos]
            pos += 1
            if first & 0x80:  # indexed field (§6.1)
                index = first & 0x7F
                if index == 0x7F:
                    index, pos = _integer(block, pos, index)
                if 0 < index <= STATIC_LAST:
                    field = STATIC[index]
                elif STATIC_LAST < index <= STATIC_LAST + len(entries):
                    field = entries[index - STATIC_LAST - 1]
                else:
                    raise InvalidTableIndex(f"Invalid table index {index}")
            elif first & 0x40:  # literal with incremental indexing (§6.2.1)
                index = first & 0x3F
                if index == 0x3F:
                    index, pos = _integer(block, pos, index)
                field, pos = self._literal(block, pos, index, False)
                self._add(field)
            elif first & 0x20:  # dynamic table size update (§6.3)
                if fields:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                size = first & 0x1F
                if size == 0x1F:
                    size, pos = _integer(block, pos, size)
                if size > self.max_table_size:
                    raise InvalidTableSizeError("Encoder exceeded max allowable table size")
                self.table_size = size
                self._evict()
                self.changes += 1
                continue
            else:  # literal without indexing or never indexed (§6.2.2, §6.2.3)
                index = first & 0x0F
                if index == 0x0F:
                    index, pos = _integer(block, pos, index)
                field, pos = self._literal(block, pos, index, True)
            put(field)
            listed += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if listed > limit:
                raise OversizedHeaderListError(f"A header list larger than {limit} has been received")
        return fields

    def _literal(self, block: bytes, pos: int, index: int, memo: bool) -> tuple[Field, int]:
        if index == 0:
            name, pos = _string(block, pos, memo)
        elif index <= STATIC_LAST:
            name = STATIC[index][0]
        elif index <= STATIC_LAST + len(self.entries):
            name = self.entries[index - STATIC_LAST - 1][0]
        else:
            raise InvalidTableIndex(f"Invalid table index {index}")
        value, pos = _string(block, pos, memo)
        return (name, value), pos

    def _add(self, field: Field) -> None:
        """§4.4: a new entry evicts the oldest until it fits; one larger than the table empties it."""
        self.changes += 1
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if size > self.table_size:
            self.entries.clear()
            self.size = 0
            return
        self.entries.appendleft(field)
        self.size += size
        self._evict()

    def _evict(self) -> None:
        entries = self.entries
        while self.size > self.table_size:
            name, value = entries.pop()
            self.size -= len(name) + len(value) + ENTRY_OVERHEAD
