"""Answers kept per worker and given again to identical requests, and identical requests inside one
batch computed once (every family; off by default: `settings.response_cache`).

A key is a digest of the model's name, its archive version, its variant and the canonical request
(JSON re-serialised with sorted keys and no spaces, so key order and whitespace do not matter; other
bodies byte for byte, with their content type). Only successful answers are kept; the caller
decides what may not be cached (sampled generations, `Cache-Control: no-cache`). Bounded in bytes and
in entries, least recently used out first, with an optional time to live.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from handlers.errors import ConfigError


@dataclass(frozen=True)
class ResponseCacheSettings:
    max_mib: float = 0  # 0: no cache
    max_entries: int = 1024
    ttl_s: float = 0  # 0: answers do not expire

    def __post_init__(self):
        if self.max_mib < 0 or self.max_entries < 1 or self.ttl_s < 0:
            raise ConfigError("response_cache: max_mib and ttl_s must be >= 0, max_entries >= 1")

    @property
    def enabled(self) -> bool:
        return self.max_mib > 0


def request_key(model: str, version: str, variant: str, body: Any, content_type: str,
                canonical: Optional[bytes] = None) -> Optional[bytes]:
    """The digest an answer is kept under; equal for requests that mean the same. None: a body
    with no canonical form (nested past Python's recursion limit, say), never cached. `canonical`:
    the body's canonical form when the caller has it already."""
    if canonical is not None:
        pass
    elif isinstance(body, (bytes, bytearray)) and content_type != "application/json":
        canonical = bytes(body)
    else:
        try:
            value = json.loads(bytes(body).decode("utf-8")) if isinstance(body, (bytes, bytearray)) else body
            canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        except (ValueError, TypeError):  # not JSON after all: as sent (its error answer is not cached)
            if not isinstance(body, (bytes, bytearray)):
                return None
            canonical = bytes(body)
        except RecursionError:
            return None
    digest = hashlib.blake2b(digest_size=20)
    for part in (model, version, variant, content_type):
        digest.update(part.encode() + b"\0")
    digest.update(canonical)
    return digest.digest()


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ResponseCache:
    def __init__(self, settings: ResponseCacheSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = int(settings.max_mib * 2**20)
        self.max_entries = settings.max_entries
        self.ttl_s = settings.ttl_s
        self.clock = clock
        self.entries: OrderedDict[bytes, tuple[bytes, float]] = OrderedDict()  # key -> (answer, stored at)
        self.nbytes = 0
        self.counts = CacheCounts()

    def get(self, key: bytes) -> Optional[bytes]:
        found = self.entries.get(key)
        if found is not None and self.ttl_s and self.clock() - found[1] > self.ttl_s:
            self._drop(key)
            found = None
        if found is None:
            self.counts.misses += 1
            return None
        self.entries.move_to_end(key)
        self.counts.hits += 1
        return found[0]

    def put(self, key: bytes, answer: bytes) -> None:
        size = len(answer) + len(key)
        if size > self.max_bytes:
            return
        if key in self.entries:
            self._drop(key)
        while self.entries and (self.nbytes + size > self.max_bytes or len(self.entries) >= self.max_entries):
            self._drop(next(iter(self.entries)))
            self.counts.evictions += 1
        self.entries[key] = (bytes(answer), self.clock())
        self.nbytes += size

    def _drop(self, key: bytes) -> None:
        answer, _ = self.entries.pop(key)
        self.nbytes -= len(answer) + len(key)

    def take_counts(self) -> CacheCounts:
        counts, self.counts = self.counts, CacheCounts()
        return counts


def coalesce(keys: list[Optional[bytes]]) -> dict[int, int]:
    """For each request of a batch with a key, the index of the first request with the same key
    (itself if it is the first): only those are computed, the others are answered the same."""
    first: dict[bytes, int] = {}
    return {idx: first.setdefault(key, idx) for idx, key in enumerate(keys) if key is not None}
