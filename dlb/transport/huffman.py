"""HPACK Huffman decoding (RFC 7541 §5.2, code table of Appendix B) one input byte per step.

Why not ``hpack``'s decoder: it walks nghttp2's state machine a nibble at a time with a flag test per
nibble, 21 µs for the 39 coded bytes of an Envoy ``traceparent``; this machine takes a whole byte per
step with failure as a state of its own (no test in the loop): 5-6 µs. Every ext_proc call carries a
fresh ``traceparent`` when Envoy traces, so the decode is on the root's request path.

The states are the 256 inner nodes of the code tree (the bits read since the last symbol); each
(state, byte) entry holds the next state and the 0-2 symbols completed on the way. Built once at
import (~80 ms, on a service's start, never on a request); 65,793 entries, ~1 MB.
"""

from __future__ import annotations

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

EOS = 256


def _tree() -> tuple[list[int], list[int], list[int]]:
    """The code tree as child arrays (node 0 the root); ``symbol[n]`` is -1 for an inner node."""
    zero, one, symbol = [-1], [-1], [-1]
    for sym, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for shift in range(length - 1, -1, -1):
            child = one if code >> shift & 1 else zero
            if child[node] < 0:
                child[node] = len(symbol)
                zero.append(-1)
                one.append(-1)
                symbol.append(-1)
            node = child[node]
        symbol[node] = sym
    return zero, one, symbol


def _tables() -> tuple[list[int], list[bytes], frozenset[int]]:
    """``NEXT[state | byte]`` (states are multiples of 256; the last one is the failure state, which
    every byte keeps), ``EMIT[state | byte]``, and the states a string may end in."""
    zero, one, symbol = _tree()
    inner = [n for n, s in enumerate(symbol) if s < 0]
    number = {n: i for i, n in enumerate(inner)}
    fail = len(inner)
    # A nibble at a time first (4 bits walked per entry), then each byte as its two nibbles.
    nib_next: list[int] = []
    nib_emit: list[bytes] = []
    for start in inner:
        for nibble in range(16):
            node, out, ok = start, bytearray(), True
            for shift in (3, 2, 1, 0):
                node = one[node] if nibble >> shift & 1 else zero[node]
                if symbol[node] == EOS:  # EOS inside a string is an error (§5.2)
                    ok = False
                    break
                if symbol[node] >= 0:
                    out.append(symbol[node])
                    node = 0
            nib_next.append(number[node] * 16 if ok else fail * 16)
            nib_emit.append(bytes(out))
    nib_next += [fail * 16] * 16
    nib_emit += [b""] * 16
    nxt: list[int] = []
    emit: list[bytes] = []
    for state in range(fail + 1):
        for hi in range(state * 16, state * 16 + 16):
            mid, first = nib_next[hi], nib_emit[hi]
            nxt.extend([nib_next[lo] * 16 for lo in range(mid, mid + 16)])
            emit.extend([first + nib_emit[lo] for lo in range(mid, mid + 16)])
    # A string ends on a symbol boundary or in its padding: at most 7 bits, all ones (the EOS prefix).
    accept, node = {0}, 0
    for _ in range(7):
        node = one[node]
        accept.add(number[node] * 256)
    return nxt, emit, frozenset(accept)


NEXT, EMIT, ACCEPT = _tables()


def decode_huffman(data: bytes) -> bytes:
    """The string ``data`` codes; :class:`HPACKDecodingError` for EOS in it or padding that is longer
    than 7 bits or not all ones."""
    state = 0
    out: list[bytes] = []
    put = out.append
    nxt, emit = NEXT, EMIT
    for byte in data:
        i = state | byte
        put(emit[i])
        state = nxt[i]
    if state not in ACCEPT:
        raise HPACKDecodingError("Invalid Huffman string")
    return b"".join(out)
