"""Decoded tokens of one response, counted from the bytes of its body as they pass (pure, bounded).

Why: BF-IO's workload view of a data-parallel group needs how far each resident request has decoded.
Between the ranks' KV reports the leaf used to estimate it as elapsed time over a learnt step time; the
response stream it proxies says it exactly. An OpenAI-compatible server streams one SSE event per decode
step (``data: {...}\\n\\n``; vLLM and the emulator: one token each), and with
``stream_options.include_usage`` a last event whose ``usage.completion_tokens`` is the server's own count.

The count is bytes-level, never JSON parsing (a chunk costs a few ``bytes.count`` calls): events ended
(a blank line, ``\\n\\n``: a newline inside a JSON string is escaped, so generated text cannot fake
one), minus those that carry no token: ``data: [DONE]``, the usage-only event (``"choices":[]``) and a
chat stream's role-only opening (vLLM). Those markers come before their event's end, so the running
count is never above the truth (a consumer that keeps its high-water mark never over-counts). A
``"completion_tokens":N`` seen anywhere replaces the event count (escaped quotes inside generated
text cannot match it).

Bounded whatever the upstream sends: the state is the last :data:`CARRY` bytes (patterns split across
chunks) and two integers; a count stops at :data:`MAX_TOKENS`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Most tokens one response is counted to: past it the upstream is not a model decoding (1 Mi tokens is
#: beyond any model's context), and counting stops.
MAX_TOKENS = 1 << 20
#: Bytes of the previous chunk kept, so a pattern split across two chunks is found (the usage key and up
#: to 19 digits fit).
CARRY = 48
_END = b"\n\n"
#: Markers of events that carry no decoded token.
_NO_TOKEN = (b"\ndata: [DONE]", b"\ndata:[DONE]", b'"choices":[]', b'"delta":{"role":"assistant","content":""}')
_USAGE = b'"completion_tokens":'


def _new(buf: bytes, pat: bytes, start: int) -> int:
    """Occurrences of ``pat`` in ``buf`` that end past ``start`` (the carried bytes end there): the
    ones lying wholly in the carry were counted with the previous chunk."""
    return buf.count(pat, max(0, start - len(pat) + 1))


@dataclass(slots=True)
class TokenCount:
    """The running count of one response body (feed it each chunk in order)."""

    ends: int = 0  # SSE events ended
    skips: int = 0  # of them (or of the one still open), events that carry no token
    usage: int = -1  # the server's own completion_tokens, -1 until seen
    #: The end of what was fed so far; a body starts at a line start.
    tail: bytes = b"\n"

    @property
    def tokens(self) -> int:
        """Decoded tokens so far: the server's usage count when it gave one, else the events."""
        return min(self.usage if self.usage >= 0 else max(0, self.ends - self.skips), MAX_TOKENS)

    @property
    def capped(self) -> bool:
        return self.tokens >= MAX_TOKENS

    def feed(self, chunk: bytes) -> int:
        """Count one chunk; returns :attr:`tokens` after it."""
        if not chunk:
            return self.tokens
        start = len(self.tail)
        buf = self.tail + chunk
        self.ends = min(self.ends + _new(buf, _END, start), 2 * MAX_TOKENS)
        self.skips = min(self.skips + sum(_new(buf, pat, start) for pat in _NO_TOKEN), 2 * MAX_TOKENS)
        if _USAGE in buf:
            self._usage(buf)
        self.tail = buf[-CARRY:]
        return self.tokens

    def _usage(self, buf: bytes) -> None:
        """The last complete ``"completion_tokens":N`` in ``buf`` (an incomplete one waits in the carry)."""
        i = buf.rfind(_USAGE)
        while i >= 0:
            j = i + len(_USAGE)
            while j < len(buf) and buf[j] in b" \t":
                j += 1
            k = j
            while k < len(buf) and 48 <= buf[k] <= 57 and k - j < 19:
                k += 1
            if k > j and k < len(buf):  # digits followed by something: the number is whole
                self.usage = min(int(buf[j:k]), MAX_TOKENS)
                return
            i = buf.rfind(_USAGE, 0, i)
