"""Decoded tokens of one response, counted from the bytes of its body as they pass (pure, bounded).

Why: BF-IO's workload view of a data-parallel group needs how far each resident request has decoded.
Between the ranks' KV reports the leaf used to estimate it as elapsed time over a learnt step time; the
response stream it proxies says it exactly. An OpenAI-compatible server streams one SSE event per decode
step (``data: {...}\\n\\n``; vLLM and the emulator: one token each), and with
``stream_options.include_usage`` a last event whose ``usage.completion_tokens`` is the server's own count.

The count is bytes-level, never JSON parsing (a chunk costs a few ``bytes.count`` calls): events are
``\\ndata:`` at a line start (a newline inside a JSON string is escaped, so generated text cannot fake
one), minus ``data: [DONE]`` and the usage-only event (``"choices":[]``). A ``"completion_tokens":N``
seen anywhere replaces the event count (escaped quotes inside generated text cannot match it). A chat
stream whose first event carries only the role (vLLM) counts one too many until the usage arrives.

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
_EVENT = b"\ndata:"
_DONE = b"\ndata: [DONE]"
_DONE_TIGHT = b"\ndata:[DONE]"
_NO_CHOICES = b'"choices":[]'
_USAGE = b'"completion_tokens":'


def _new(buf: bytes, pat: bytes, start: int) -> int:
    """Occurrences of ``pat`` in ``buf`` that end past ``start`` (the carried bytes end there): the
    ones lying wholly in the carry were counted with the previous chunk."""
    return buf.count(pat, max(0, start - len(pat) + 1))


@dataclass(slots=True)
class TokenCount:
    """The running count of one response body (feed it each chunk in order)."""

    events: int = 0  # SSE events that carry a decode step
    usage: int = -1  # the server's own completion_tokens, -1 until seen
    #: The end of what was fed so far; a body starts at a line start.
    tail: bytes = b"\n"

    @property
    def tokens(self) -> int:
        """Decoded tokens so far: the server's usage count when it gave one, else the events."""
        return min(self.usage if self.usage >= 0 else self.events, MAX_TOKENS)

    @property
    def capped(self) -> bool:
        return self.tokens >= MAX_TOKENS

    def feed(self, chunk: bytes) -> int:
        """Count one chunk; returns :attr:`tokens` after it."""
        if not chunk:
            return self.tokens
        start = len(self.tail)
        buf = self.tail + chunk
        self.events += (_new(buf, _EVENT, start) - _new(buf, _DONE, start) - _new(buf, _DONE_TIGHT, start)
                        - _new(buf, _NO_CHOICES, start))
        self.events = max(0, min(self.events, MAX_TOKENS))
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
