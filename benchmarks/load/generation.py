"""Generation requests over real HTTP: one streamed request timed chunk by chunk, and closed-loop
clients that keep generating. Time to first token is the first body byte (the server sends a
streamed request's first line with its first token); inter-token gaps are between chunks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Optional

import requests

from serving.client import Client


@dataclass(frozen=True)
class GenerationResult:
    status: int
    sent_at: float
    chunk_times: tuple  # perf_counter of each body chunk's arrival
    done_at: float
    text: str
    generated_tokens: int
    finish_reason: Optional[str]
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    @property
    def ttft_s(self) -> float:
        return (self.chunk_times[0] if self.chunk_times else self.done_at) - self.sent_at

    @property
    def gaps_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


def generate(client: Client, model: str, body: Mapping, stream: bool = True, timeout_s: float = 300.0,
             stop_after_chunks: Optional[int] = None, headers: Optional[Mapping[str, str]] = None) -> GenerationResult:
    """One request; `stop_after_chunks`: hang up after that many chunks (a client that leaves)."""
    sent = time.perf_counter()
    times, raw = [], b""
    try:
        with client.predict(model, {**body, "stream": stream}, timeout_s=timeout_s, stream=True,
                            headers=headers) as resp:
            for chunk in resp.iter_content(chunk_size=None):
                if chunk:
                    times.append(time.perf_counter())
                    raw += chunk
                    if stop_after_chunks is not None and len(times) >= stop_after_chunks:
                        break
            status = resp.status_code
    except requests.RequestException as err:
        return GenerationResult(0, sent, tuple(times), time.perf_counter(), "", 0, None, f"{type(err).__name__}: {err}")
    done = time.perf_counter()
    text, tokens, reason, error = _read_body(raw, stream, status)
    return GenerationResult(status, sent, tuple(times), done, text, tokens, reason, error)


def _read_body(raw: bytes, stream: bool, status: int):
    try:
        if stream and status == 200:
            lines = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
            last = lines[-1] if lines else {}
            return "".join(line.get("text", "") for line in lines), last.get("generated_tokens", 0), \
                last.get("finish_reason"), ""
        answer = json.loads(raw.decode("utf-8")) if raw else {}
    except (ValueError, UnicodeDecodeError) as err:
        return "", 0, None, f"unreadable body: {err}"
    if status != 200:
        return "", 0, None, str(answer.get("message", answer))[:200]
    return answer.get("text", ""), answer.get("generated_tokens", 0), answer.get("finish_reason"), ""


@dataclass
class Generators:
    """`clients` threads, each sending `body_for(client, i)` back to back until stopped."""

    client: Client
    model: str
    clients: int
    body_for: Callable[[int, int], Mapping]
    stream: bool = True
    headers: Optional[Mapping[str, str]] = None
    results: list[GenerationResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(c,), daemon=True) for c in range(self.clients)]

    def _loop(self, client_index: int) -> None:
        i = 0
        while not self._stop.is_set():
            result = generate(self.client, self.model, self.body_for(client_index, i), stream=self.stream,
                              headers=self.headers)
            with self._lock:
                self.results.append(result)
            i += 1

    def __enter__(self) -> Generators:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[GenerationResult]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=600)
        return list(self.results)

    def __exit__(self, *exc) -> None:
        self.stop()
