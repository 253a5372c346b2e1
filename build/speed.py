"""A variant's in-process speed for the build report: items/s at batch 1 and 8 on one thread (the
thread budget a worker gets when workers share the cores), on the entry's first example."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from build.catalogue import ModelEntry
from build.examples import worker_input
from handlers import runtime
from handlers.families import Family
from handlers.settings import SERIALISED_GRAPHS, HandlerSettings

BATCH_SIZES = (1, 8)
SECONDS = 1.5  # per batch size: enough for a steady rate; tests and quick builds pass less


def inprocess_speed(entry: ModelEntry, family: Family, load: Callable[[], Callable], settings: HandlerSettings,
                    root: Path, seconds: float = SECONDS) -> dict[str, float]:
    """`load`: loads the served model; called on one thread (an ONNX session keeps the threads it is made with)."""
    if entry.examples:
        request = entry.examples[0].request(root)
        item = family.decode(worker_input(request.body, request.content_type), request.content_type)
        batches = {size: family.collate([item] * size) for size in BATCH_SIZES}
    else:
        batches = {size: family.example_batch(size) for size in BATCH_SIZES}
    rt = settings.runtime
    dtype = None if rt.graph in SERIALISED_GRAPHS else runtime.resolve_precision(rt.precision, torch.device("cpu"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = load()
        return {str(size): round(_rate(model, family.model_inputs(batch), size, dtype, rt.channels_last, seconds), 1)
                for size, batch in batches.items()}
    finally:
        torch.set_num_threads(threads)


def _rate(model: Callable, batch, size: int, dtype, channels_last: bool, seconds: float) -> float:
    inputs = tuple(runtime.memory_format(t, channels_last) for t in batch)
    with torch.inference_mode(), runtime.autocast(torch.device("cpu"), dtype):
        for _ in range(2):
            model(*inputs)
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            model(*inputs)
            done += size
    return done / (time.perf_counter() - started)
