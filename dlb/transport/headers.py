"""Request header blocks: HPACK decoding with a bounded exact cache, and RFC 9113 §8 validation.

Why a cache: Envoy's encoder sends the same bytes for every ext_proc stream once its dynamic table is
warm (``:path`` as a literal *without* indexing, the rest as indexed fields), and decoding one costs
~10 µs of pure Python (``hpack_decoder``) against a dictionary look-up. When Envoy traces, no block
repeats (each carries a new indexed ``traceparent``): the decoder's shifted template (``hpack_decoder``)
then decodes only that literal, and the head is the template's with it. A block that neither adds an
entry nor resizes the table
decodes to the same fields for as long as the table is unchanged, and decoding it again would leave
the table as it is — so the cache is exact. Any block that does change the table clears the cache
(its entries may refer to indices that now mean something else).

Why bounded in bytes, per connection and in total: a peer chooses the blocks. 64 distinct cacheable
blocks of ~245 KB each held 34 MB per connection until close (issue 14, row 1); now an entry costs its
key plus its decoded fields, a connection holds at most ``H2Limits.header_cache_bytes`` and the server
``header_cache_total_bytes`` (``TransportStats.header_cache_bytes``), and :meth:`release` returns a
closed connection's share. A block that does not fit is decoded and not cached (counted).

Validation (what makes a request malformed, RFC 9113 §8.2-8.3) is computed once per distinct block and
cached with it, so the request path pays for it only on a miss.
"""

from __future__ import annotations

from typing import NamedTuple

from dlb.transport.hpack_decoder import Decoder, Template
from dlb.transport.limits import H2Limits, TransportStats

#: Header fields that are HTTP/1 connection-specific: a request carrying one is malformed (§8.2.2).
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})
TRACEPARENT = b"traceparent"
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
#: Bookkeeping cost charged per cached field on top of its bytes (tuple and two bytes objects).
FIELD_OVERHEAD = 96


class HeaderBlock(NamedTuple):
    """A decoded header block and what a server needs from it (immutable: cached blocks are shared; a
    NamedTuple because one is built per block a traced Envoy sends, 3x cheaper than a frozen dataclass)."""

    fields: list[tuple[bytes, bytes]]
    method: bytes | None
    path: bytes | None
    content_type: bytes | None
    content_length: int | None
    malformed: str  # why the block is not a valid *request* head ("" = valid)
    has_pseudo: bool  # a trailer block with pseudo-headers is malformed
    #: The call's W3C trace context: Envoy sends its ext_proc call's span here when it traces.
    traceparent: bytes | None = None

    @property
    def cost(self) -> int:
        return sum(len(k) + len(v) + FIELD_OVERHEAD for k, v in self.fields)


def parse_head(fields: list[tuple[bytes, bytes]]) -> HeaderBlock:
    """Pick the fields the server uses and say why the block would be a malformed request, if it is."""
    pseudo: dict[bytes, bytes] = {}
    malformed = ""
    regular_seen = False
    ctype = traceparent = None
    clen: int | None = None
    for k, v in fields:
        if k[:1] == b":":
            if regular_seen:
                malformed = malformed or "pseudo-header after a regular field"
            if k not in REQUEST_PSEUDO:
                malformed = malformed or f"pseudo-header {k.decode('latin-1')!r} not allowed in a request"
            if k in pseudo:
                malformed = malformed or f"duplicate {k.decode('latin-1')}"
            pseudo[k] = v
            continue
        regular_seen = True
        if k != k.lower():
            malformed = malformed or "uppercase header field name"
        elif k in CONNECTION_SPECIFIC:
            malformed = malformed or f"connection-specific field {k.decode('latin-1')}"
        elif k == b"te" and v != b"trailers":
            malformed = malformed or "te other than trailers"
        elif k == b"content-type":
            ctype = v
        elif k == TRACEPARENT:
            traceparent = v
        elif k == b"content-length":
            if not v.isdigit() or (clen is not None and clen != int(v)):
                malformed = malformed or "bad content-length"
            else:
                clen = int(v)
    method = pseudo.get(b":method")
    path = pseudo.get(b":path")
    if method is None:
        malformed = malformed or "no :method"
    elif method != b"CONNECT":
        if b":scheme" not in pseudo:
            malformed = malformed or "no :scheme"
        if not path:
            malformed = malformed or "no :path or an empty one"
    return HeaderBlock(fields, method, path, ctype, clen, malformed, bool(pseudo), traceparent)


class CachingDecoder:
    """:class:`Decoder` plus a bounded exact cache of header blocks that leave the dynamic table unchanged."""

    def __init__(self, max_header_list_size: int, stats: TransportStats | None = None, limits: H2Limits | None = None) -> None:
        self.decoder = Decoder(max_header_list_size)
        self.limits = limits or H2Limits()
        self.stats = stats if stats is not None else TransportStats()
        self.cache: dict[bytes, HeaderBlock] = {}
        self.cache_bytes = 0
        self.hits = 0
        #: The decoder's template whose traceparent is its only varying field, and its block's head: a
        #: block that matches it has the same head but for ``fields`` and ``traceparent``.
        self._reuse: tuple[Template, HeaderBlock] | None = None

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        return self.decode_head(block).fields

    def decode_head(self, block: bytes) -> HeaderBlock:
        hit = self.cache.get(block)
        if hit is not None:
            self.hits += 1
            return hit
        dec = self.decoder
        changes, template = dec.changes, dec.template
        fields = dec.decode(block)
        used, reuse = dec.used, self._reuse
        if used is not None and reuse is not None and used is reuse[0] and fields[len(used.before)][0] == TRACEPARENT:
            # The template's block with a new traceparent: its checks, with this traceparent.
            # (tuple.__new__ directly: NamedTuple's _replace is Python code, ~1 µs.)
            head = tuple.__new__(HeaderBlock, (fields, *reuse[1][1:7], fields[len(used.before)][1]))
        else:
            head = parse_head(fields)
            if dec.template is not template and dec.template is not None:  # this block became the template
                t = dec.template
                if fields[len(t.before)][0] == TRACEPARENT and all(k != TRACEPARENT for k, _ in t.after):
                    self._reuse = (t, head)
        if dec.changes == changes:
            self._store(block, head)
        elif self.cache_bytes:
            self.release()
        return head

    def _store(self, block: bytes, head: HeaderBlock) -> None:
        cost = len(block) + head.cost
        limits, stats = self.limits, self.stats
        if cost > limits.header_cache_bytes // 4:  # one block may not take more than a quarter
            stats.header_cache_refused += 1
            return
        if self.cache_bytes + cost > limits.header_cache_bytes:
            stats.header_cache_refused += 1  # full: start over (the steady-state blocks come back at once)
            self.release()
        if stats.header_cache_bytes + cost > limits.header_cache_total_bytes:
            stats.header_cache_refused += 1
            return
        self.cache[block] = head
        self.cache_bytes += cost
        stats.header_cache_bytes += cost

    def release(self) -> None:
        """Drop every cached block and return its bytes to the server's total (also on close)."""
        self.cache.clear()
        self.stats.header_cache_bytes -= self.cache_bytes
        self.cache_bytes = 0

