"""Small helpers for the e2e tests: inputs, concurrent posting, comparisons."""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import requests
from PIL import Image

from benchmarks.serving.launcher import TorchServe
from benchmarks.serving.server_metrics import BATCHES, Scrape


class Request(NamedTuple):
    body: bytes
    content_type: str


def jpeg_of(png: Path, quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.open(png).convert("RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def pixel_bomb_png(width: int = 8000, height: int = 6000) -> bytes:
    """A tiny PNG file (1-bit, all black) whose header claims 48 Mpixels: over the handler's limit."""
    out = io.BytesIO()
    Image.new("1", (width, height)).save(out, format="PNG", optimize=True)
    return out.getvalue()


def post_together(server: TorchServe, model: str, requests_: list[Request]) -> list[requests.Response]:
    """POST all at once (a barrier releases every thread together) so that they share batches."""
    barrier = threading.Barrier(len(requests_))

    def post(req: Request) -> requests.Response:
        barrier.wait(timeout=30)
        return server.predict(model, req.body, req.content_type)

    with ThreadPoolExecutor(max_workers=len(requests_)) as pool:
        return list(pool.map(post, requests_))


def embedding(resp: requests.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    vector = np.asarray(resp.json()["embedding"], dtype=np.float64)
    assert vector.shape == (384,)
    return vector


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def top5(resp: requests.Response) -> dict[str, float]:
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert isinstance(answer, dict) and len(answer) == 5, answer
    probs = list(answer.values())
    assert probs == sorted(probs, reverse=True), answer
    assert all(0.0 <= p <= 1.0 for p in probs) and sum(probs) <= 1.0 + 1e-3, answer
    return answer


def assert_bad_request(resp: requests.Response) -> None:
    """400 with TorchServe's error JSON and a message that says something."""
    assert resp.status_code == 400, (resp.status_code, resp.text)
    body = resp.json()
    assert body.get("code") == 400, body
    assert body.get("type"), body
    assert isinstance(body.get("message"), str) and len(body["message"]) > 5, body


def formed_batches(server: TorchServe, model: str) -> dict[int, int]:
    """Batches formed so far per batch size (the handler's HandlerBatches{BatchSize=...} counter)."""
    counts = Scrape.of(server.metrics_text()).by_label(BATCHES, model, "BatchSize")
    return {int(size): int(n) for size, n in counts.items() if n > 0}


def batches_since(server: TorchServe, model: str, before: dict[int, int], items: int,
                  timeout_s: float = 10.0) -> dict[int, int]:
    """Batches formed since `before`, once they account for `items` accepted requests: workers
    report metrics through their log stream, a moment after the answers went out (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = formed_batches(server, model)
        new = {size: n - before.get(size, 0) for size, n in now.items() if n > before.get(size, 0)}
        if sum(size * n for size, n in new.items()) >= items or time.monotonic() > deadline:
            return new
        time.sleep(0.2)
