"""A fake TorchServe context that counts how often the handler reads each request's parts: its
headers (get_all_request_header / get_request_header, per index) and its body (per request dict),
and a counter of JSON parses. What the one-read tests measure."""

from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager

from serving.fake_context import FakeContext


class CountingContext(FakeContext):
    """A FakeContext whose header reads are counted per request index."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_reads: Counter = Counter()

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        self.header_reads[idx] += 1
        return super().get_all_request_header(idx)

    def get_request_header(self, idx: int, key: str):
        self.header_reads[idx] += 1
        return super().get_all_request_header(idx).get(key)


class CountingRequest(dict):
    """One request as TorchServe hands it to a handler ({"body": ...}), its reads counted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = 0

    def __getitem__(self, key):
        self.reads += 1
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.reads += 1
        return super().get(key, default)

    def values(self):
        self.reads += 1
        return super().values()


@contextmanager
def counting_json_parses(monkeypatch):
    """Counts json.loads calls (every JSON parse of the handlers goes through it)."""
    calls = Counter()
    real = json.loads

    def counted(*args, **kwargs):
        calls["loads"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(json, "loads", counted)
    yield calls
