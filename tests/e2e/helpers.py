"""Small helpers for the e2e tests: inputs, concurrent posting, comparisons, any family."""

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

from benchmarks.load.inputs import requests as example_requests
from benchmarks.load.server_metrics import BATCHES, Scrape
from benchmarks.reliability.corpus import HANDLER, Case, family_cases
from build.catalogue import Catalogue
from build.examples import Example, expected_top1, worker_input
from build.export import served_settings
from handlers.families import family_class
from handlers.settings import HandlerSettings
from serving.launcher import TorchServe
from serving.repo import CATALOGUE, MODEL_STORE
from tests.references import decoded


class Request(NamedTuple):
    body: bytes
    content_type: str


def store_with(model_store: Path, folder: Path, model: str, sections: dict) -> Path:
    """`folder`: every archive of `model_store` (linked), `model`'s copied with its handler settings
    changed (`{"causal_lm": {"mode": "step"}}`, say)."""
    from benchmarks.bench.archive_settings import with_handler_settings

    with_handler_settings(model_store / f"{model}.mar", folder, model, sections)
    for archive in model_store.glob("*.mar"):
        if not (folder / archive.name).exists():
            (folder / archive.name).symlink_to(archive.resolve())
    return folder


def settings_of(model: str) -> HandlerSettings:
    return served_settings(Catalogue.load(CATALOGUE).entry(model))


def examples_of(model: str) -> list[tuple[Example, Request]]:
    entry = Catalogue.load(CATALOGUE).entry(model)
    return [(e, Request(r.body, r.content_type)) for e, r in zip(entry.examples, example_requests(model))]


def bad_cases(model: str, count: int = 3) -> list[Case]:
    """The first `count` requests of the model's family corpus that its handler must refuse with a 400."""
    settings = settings_of(model)
    refused = [c for c in family_cases(settings.family, settings.family_settings)
               if not c.valid and c.status == 400 and c.layer == HANDLER and c.content_type is not None
               and not c.form_encoded]
    return refused[:count]


def answered(resp: requests.Response, model: str, example: Example | None = None) -> dict:
    """A 200 whose answer has the family's shape (and the example's expected top-1, if it has one)."""
    from benchmarks.reliability.badinput import well_formed

    assert resp.status_code == 200, resp.text
    assert well_formed(settings_of(model), resp), resp.text[:300]
    answer = resp.json()
    if example is not None:
        problem = expected_top1(example, answer)
        assert problem is None, problem
    return answer


def assert_same_answer(model: str, one, other, label: str = "") -> None:
    settings = settings_of(model)
    assert_agree(settings.family, settings.family_settings, one, other, label)


def assert_agree(family: str, family_settings, one, other, label: str = "") -> None:
    """Two answers to one request agree within the family's own tolerance (Family.disagreement)."""
    problem = family_class(family).disagreement(family_settings, one, other)
    assert problem is None, f"{label}: {problem}"


def inprocess_answers(model: str, requests_: list[Request], tmp: Path, store: Path = MODEL_STORE) -> list[dict]:
    """The same archive the server runs, its handler in this process, one request at a time."""
    from handlers.handler import Handler
    from serving.fake_context import FakeContext, extract

    model_dir = extract(store / f"{model}.mar", tmp / model)
    context = FakeContext(model_dir, model, batch_size=1, handler_overrides={"runtime": {"warmup": False}})
    handler = Handler()
    handler.initialize(context)
    answers = []
    for r in requests_:
        context.headers, context.statuses = {0: {"Content-Type": r.content_type}}, {}
        answers.append(decoded(handler.handle([{"body": worker_input(r.body, r.content_type)}], context))[0])
        assert not context.statuses, context.statuses
    return answers


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


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


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
