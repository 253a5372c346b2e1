"""Small helpers for the e2e tests: inputs, concurrent posting, comparisons."""

from __future__ import annotations

import io
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import requests
from PIL import Image

from benchmarks.serving.launcher import TorchServe

CAT_LABELS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}  # ImageNet 281-285
WORKER_DEATH = re.compile(r"worker died|worker disconnected|backend worker process died", re.IGNORECASE)


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


def formed_batch_sizes(metrics_text: str, model: str) -> set[int]:
    """Batch sizes the handler reported (HandlerBatches{BatchSize=...}) for one model."""
    sizes = set()
    for line in metrics_text.splitlines():
        if line.startswith("HandlerBatches{") and f'ModelName="{model}"' in line:
            match = re.search(r'BatchSize="(\d+)"', line)
            if match and float(line.rsplit(" ", 1)[1]) > 0:
                sizes.add(int(match.group(1)))
    return sizes
