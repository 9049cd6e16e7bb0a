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

Why a shifted template: a traced Envoy's blocks differ from call to call only in the new
``traceparent`` literal and in every dynamic index, which grows by one per call (each call inserts
one entry). An index counted from the newest entry names the same entry once the count of insertions
since is added, so a block whose bytes equal the last single-insertion block's with each dynamic index
moved by that count (one integer comparison either side of the literal) decodes to that block's fields
with the new literal in place: only the literal is decoded (~3 µs of Huffman instead of ~10 µs for
the block). Exact: the bytes are compared, the named entries must still be in the table (else the rest
is decoded the slow way), and anything else (a size update, a second insertion, a multi-byte dynamic
index) takes the full loop.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import NamedTuple

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


class Template(NamedTuple):
    """The last block that made one insertion (its one literal with incremental indexing), cut around it.

    ``before``/``after``: the fields either side; ``*_int`` the bytes either side as one integer,
    ``*_mask`` a 1 in each byte that holds a dynamic index (single-byte indexed fields), ``*_max`` the
    largest of those indices (0: none). ``inserted``: the decoder's insertion count before the block
    (its indices count from then)."""

    epoch: int
    inserted: int
    p_len: int
    p_int: int
    p_mask: int
    p_max: int
    s_len: int
    s_int: int
    s_mask: int
    s_max: int
    before: list[Field]
    after: list[Field]
    listed: int  # §4.1 sizes of before and after


def _skip(block: bytes, pos: int) -> int:
    """Past a string literal of a block already decoded."""
    length = block[pos] & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _integer(block, pos, length)
    return pos + length


def _shape(block: bytes, fields: list[Field], epoch: int, inserted: int) -> Template | None:
    """``block`` (decoded to ``fields``, one insertion) as a template, or None when it cannot be one."""
    pos, end, n = 0, len(block), 0
    cut = rest = -1
    k = 0
    dynamic: list[tuple[int, int]] = []  # (byte position, index) of single-byte dynamic indexed fields
    while pos < end:
        first = block[pos]
        if first & 0x80:
            index = first & 0x7F
            if index == 0x7F:
                return None
            if index > STATIC_LAST:
                dynamic.append((pos, index))
            pos += 1
        elif first & 0x40:
            if cut >= 0:
                return None
            cut, k = pos, n
            index = first & 0x3F
            pos += 1
            if index == 0x3F:
                index, pos = _integer(block, pos, index)
            if index == 0:
                pos = _skip(block, pos)
            pos = rest = _skip(block, pos)
        elif first & 0x20:
            return None
        else:
            index = first & 0x0F
            pos += 1
            if index == 0x0F:
                index, pos = _integer(block, pos, index)
            if index > STATIC_LAST:  # a dynamic name in a literal: its index is not one byte
                return None
            if index == 0:
                pos = _skip(block, pos)
            pos = _skip(block, pos)
        n += 1
    if cut < 0:
        return None
    p_mask = sum(1 << 8 * (cut - 1 - p) for p, _ in dynamic if p < cut)
    s_mask = sum(1 << 8 * (end - 1 - p) for p, _ in dynamic if p > cut)
    p_max = max((i for p, i in dynamic if p < cut), default=0)
    s_max = max((i for p, i in dynamic if p > cut), default=0)
    before, after = fields[:k], fields[k + 1:]
    listed = sum(len(a) + len(b) + ENTRY_OVERHEAD for a, b in before + after)
    return Template(epoch, inserted, cut, int.from_bytes(block[:cut], "big"), p_mask, p_max,
                    end - rest, int.from_bytes(block[rest:], "big"), s_mask, s_max, before, after, listed)


class Decoder:
    """One connection's HPACK decoding context: ``decode(block)`` returns the block's fields in order."""

    def __init__(self, max_header_list_size: int, max_table_size: int = DEFAULT_TABLE_SIZE) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_table_size = max_table_size  # what the peer may set the table to (our SETTINGS)
        self.entries: deque[Field] = deque()  # the dynamic table, newest first (index 62 = entries[0])
        self.size = 0  # §4.1 size of the entries
        self.table_size = max_table_size  # the peer's current maximum (§6.3 updates it)
        self.changes = 0  # count of insertions and size updates: a block that leaves it alone changed nothing
        self.inserted = 0  # entries added (each shifts every dynamic index by one)
        self.epoch = 0  # bumped when the table shrinks or empties other than by eviction: templates expire
        self.template: Template | None = None
        self.used: Template | None = None  # the template the last block matched (None: decoded in full)

    def decode(self, block: bytes) -> list[Field]:
        """The fields of one complete header block; HPACKDecodingError (or a subclass) when it is not
        valid HPACK or exceeds a bound: the connection's table is then unknown and the connection lost."""
        t = self.template
        self.used = None
        if t is not None and t.epoch == self.epoch:
            shifted = self._shifted(block, t)
            if shifted is not None:
                return shifted
        inserted, epoch, changes = self.inserted, self.epoch, self.changes
        fields = self._run(block, 0, [], 0)
        if self.inserted == inserted + 1 and self.changes == changes + 1 and self.epoch == epoch:
            self.template = _shape(block, fields, epoch, inserted)
        return fields

    def _shifted(self, block: bytes, t: Template) -> list[Field] | None:
        """``block``'s fields if it is ``t`` with every dynamic index moved by the insertions since (the
        table then changed as decoding it in full would), else None with nothing changed."""
        d = self.inserted - t.inserted
        room = STATIC_LAST + len(self.entries)
        p_len, s_len = t.p_len, t.s_len
        if (t.p_max and (t.p_max + d > 126 or t.p_max + d > room)) or (t.s_max and t.s_max + d > 126):
            return None
        if len(block) < p_len + s_len + 2 or int.from_bytes(block[:p_len], "big") != t.p_int + d * t.p_mask:
            return None
        first = block[p_len]
        if first & 0xC0 != 0x40:
            return None
        try:
            index = first & 0x3F
            pos = p_len + 1
            if index == 0x3F:
                index, pos = _integer(block, pos, index)
            if index == 0:
                name, pos = _string(block, pos)
            elif index <= room:
                name = STATIC[index][0] if index <= STATIC_LAST else self.entries[index - STATIC_LAST - 1][0]
            else:
                return None
            if len(block) - pos < s_len:
                return None
            value, pos = _string(block, pos)
        except HPACKDecodingError:
            return None  # the full loop raises it again, at the same representation
        if len(block) - pos != s_len or (s_len and int.from_bytes(block[pos:], "big") != t.s_int + d * t.s_mask):
            return None
        field = (name, value)
        self._add(field)
        listed = t.listed + len(name) + len(value) + ENTRY_OVERHEAD
        if listed > self.max_header_list_size:
            raise OversizedHeaderListError(f"A header list larger than {self.max_header_list_size} has been received")
        if t.s_max and t.s_max + d > STATIC_LAST + len(self.entries):  # the insertion evicted what the rest names
            return self._run(block, pos, [*t.before, field], listed - sum(len(a) + len(b) + ENTRY_OVERHEAD for a, b in t.after))
        self.used = t
        return [*t.before, field, *t.after]

    def _run(self, block: bytes, pos: int, fields: list[Field], listed: int) -> list[Field]:
        """The representations of ``block`` from ``pos`` on, appended to ``fields`` (``listed``: their sizes)."""
        put = fields.append
        limit = self.max_header_list_size
        entries = self.entries
        end = len(block)
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
                self.epoch += 1
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
            self.epoch += 1
            return
        self.inserted += 1
        self.entries.appendleft(field)
        self.size += size
        self._evict()

    def _evict(self) -> None:
        entries = self.entries
        while self.size > self.table_size:
            name, value = entries.pop()
            self.size -= len(name) + len(value) + ENTRY_OVERHEAD
