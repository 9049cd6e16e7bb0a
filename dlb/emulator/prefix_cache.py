"""Automatic prefix caching, as vLLM does it, reduced to what changes latency (pure).

A prompt is cut into fixed-size blocks; each block is identified by a hash chained over every block
before it, so a block hits only if the whole prefix up to it is identical. A request's leading blocks
found in the cache skip prefill — the saving conditional affinity (DESIGN §3, paper 3.5) trades
against load. Blocks enter the cache once their prefill is done and are evicted least recently used.
Text prompts use ``CHARS_PER_TOKEN``-character pieces as tokens, consistent with the token estimate.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK_TOKENS = 16  # vLLM's default KV block size


def _chain(prev: bytes, piece: bytes) -> bytes:
    return hashlib.blake2b(prev + piece, digest_size=8).digest()


def text_blocks(text: str, chars_per_token: int, block_tokens: int = BLOCK_TOKENS) -> tuple[bytes, ...]:
    """Chained hashes of every *full* block of ``text`` (a partial last block is never cached)."""
    size = chars_per_token * block_tokens
    out: list[bytes] = []
    prev = b""
    for i in range(0, len(text) - size + 1, size):
        prev = _chain(prev, text[i : i + size].encode())
        out.append(prev)
    return tuple(out)


def token_blocks(ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> tuple[bytes, ...]:
    out: list[bytes] = []
    prev = b""
    for i in range(0, len(ids) - block_tokens + 1, block_tokens):
        prev = _chain(prev, b",".join(str(t).encode() for t in ids[i : i + block_tokens]))
        out.append(prev)
    return tuple(out)


@dataclass
class PrefixCache:
    """LRU set of cached blocks; ``capacity_blocks`` bounds it (KV memory set aside for reuse)."""

    capacity_blocks: int
    block_tokens: int = BLOCK_TOKENS
    _blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be >= 1, got {self.capacity_blocks}")

    def match(self, blocks: Sequence[bytes]) -> int:
        """Tokens of the longest cached prefix of ``blocks``; touched blocks become most recent."""
        hit = 0
        for b in blocks:
            if b not in self._blocks:
                break
            self._blocks.move_to_end(b)
            hit += 1
        return hit * self.block_tokens

    def insert(self, blocks: Sequence[bytes]) -> None:
        for b in blocks:
            self._blocks[b] = None
            self._blocks.move_to_end(b)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)
