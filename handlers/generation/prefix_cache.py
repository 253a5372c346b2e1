"""Keys and values of prompt prefixes, reused by later prompts that start the same way (a system
prompt, a few-shot header): per worker, least recently used first out, bounded in bytes.

An entry holds the keys/values of one prompt's first L tokens (L a multiple of `block`, at least
one token short of the prompt, which the model must still read to give the next token's logits).
It is found under the token ids of every block boundary up to L, so a prompt that shares only the
first 1,000 tokens of a longer one still finds those. Keys are digests of the token ids.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, heads, time, head_dim)


@dataclass
class _Entry:
    length: int
    layers: Layers
    nbytes: int
    keys: list[bytes] = field(default_factory=list)


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    evictions: int = 0


class PrefixCache:
    def __init__(self, max_bytes: int, block: int = 32) -> None:
        self.max_bytes = max_bytes
        self.block = block
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # by id, oldest use first
        self.index: dict[bytes, int] = {}  # digest of the first b tokens -> entry id
        self.nbytes = 0
        self.counts = CacheCounts()  # since the last take_counts()
        self._next_id = 0

    def _boundaries(self, ids: Sequence[int]) -> list[tuple[int, bytes]]:
        """(b, digest of ids[:b]) for every multiple b of the block below len(ids)."""
        raw = array("q", ids).tobytes()
        digest = hashlib.blake2b(digest_size=16)
        out, width = [], array("q").itemsize
        for end in range(self.block, len(ids), self.block):
            digest.update(raw[(end - self.block) * width:end * width])
            out.append((end, digest.copy().digest()))
        return out

    def lookup(self, ids: Sequence[int]) -> Optional[tuple[int, Layers]]:
        """The longest cached prefix of `ids`: (its length, its keys/values), or None."""
        for length, key in reversed(self._boundaries(ids)):
            entry_id = self.index.get(key)
            if entry_id is not None:
                entry = self.entries[entry_id]
                self.entries.move_to_end(entry_id)
                self.counts.hits += 1
                self.counts.reused_tokens += length
                return length, [(k[:, :, :length], v[:, :, :length]) for k, v in entry.layers]
        self.counts.misses += 1
        return None

    def store(self, ids: Sequence[int], layers: Layers) -> None:
        """Keep the longest block-aligned prefix of this prompt (`layers`: its keys/values, one row,
        the prompt's tokens only), unless an entry already covers it."""
        boundaries = self._boundaries(ids)
        if not boundaries or self.max_bytes <= 0:
            return
        length, last = boundaries[-1]
        if last in self.index:
            self.entries.move_to_end(self.index[last])
            return
        kept = [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in layers]
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kept)
        if nbytes > self.max_bytes:
            return
        while self.nbytes + nbytes > self.max_bytes:
            self._evict(next(iter(self.entries)))
        entry_id, self._next_id = self._next_id, self._next_id + 1
        entry = self.entries[entry_id] = _Entry(length, kept, nbytes, [key for _, key in boundaries])
        self.nbytes += nbytes
        for key in entry.keys:
            older = self.index.get(key)
            self.index[key] = entry_id
            if older is not None and all(self.index.get(k) != older for k in self.entries[older].keys):
                self._evict(older, counted=False)  # the new entry covers all the older one did

    def _evict(self, entry_id: int, counted: bool = True) -> None:
        entry = self.entries.pop(entry_id)
        self.nbytes -= entry.nbytes
        for key in entry.keys:
            if self.index.get(key) == entry_id:
                del self.index[key]
        if counted:
            self.counts.evictions += 1

    def take_counts(self) -> CacheCounts:
        counts, self.counts = self.counts, CacheCounts()
        return counts
