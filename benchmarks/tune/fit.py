"""The tuner's in-process fit: batch service times s(b) of the whole handler, no server.

The whole handler (benchmarks.bench.inprocess.measure) on the real inputs, one handler per thread
count, batch sizes rising until one batch alone takes longer than the SLO (larger ones can never
meet it: no point measuring them). Each size is the best of three short runs: on a shared machine
noise only ever slows a run down.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.load import resources
from benchmarks.tune.service_model import FitPoint

Progress = Callable[[str], None]
FIT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
REPEATS = 3
# Other processes' CPU during a measurement (100 = a whole core) above which it is measured again
# (with --wait-quiet): on 2 cores that is a quarter of the machine gone.
NOISY_OTHERS_PCT = 50.0


@dataclass(frozen=True)
class FitPlan:
    model: str
    thread_counts: tuple[int, ...]
    max_batch_size: int
    slo_ms: float
    seconds: float  # per (threads, batch size)
    wait_quiet_s: float = 0.0  # > 0: a measurement other processes disturbed is repeated when quiet
    variant: Optional[str] = None  # the catalogue variant's archive (build/variants.py); None: the default
    device: str = "cpu"  # cuda: the handler as a worker handed gpu_id 0


def _others_cpu(since: resources.Reading, groups: resources.ProcessGroups) -> float:
    """CPU every other process used since a reading (100 = one core)."""
    return resources.usage(since, groups.read())[resources.OTHERS].cpu_pct


def inprocess_fit(plan: FitPlan, progress: Progress) -> dict:
    """{"points": [FitPoint json...], "seconds": wall time}: s(b) for each thread count.

    With plan.wait_quiet_s, a measurement during which other processes took more than half a core is
    repeated once the machine is quiet again (waiting is not counted in "seconds")."""
    from benchmarks.bench.inprocess import extracted_archive, measure
    from benchmarks.load.inputs import worker_requests
    from handlers.handler import Handler
    from serving.fake_context import FakeContext

    began = time.perf_counter()
    sizes = [b for b in FIT_BATCH_SIZES if b <= plan.max_batch_size] or [1]
    if plan.max_batch_size not in sizes and plan.max_batch_size > sizes[-1]:
        sizes.append(plan.max_batch_size)
    requests = worker_requests(plan.model)
    points = []
    me = resources.ProcessGroups({"fit": [os.getpid()]})
    with tempfile.TemporaryDirectory(prefix="tune-fit-") as tmp:
        model_dir = extracted_archive(plan.model, plan.variant, Path(tmp))
        for count in plan.thread_counts:
            context = FakeContext(model_dir, plan.model, batch_size=max(sizes),
                                  handler_overrides={"runtime": {"threads": count, "warmup": False}},
                                  gpu_id=0 if plan.device == "cuda" else None)
            handler = Handler()
            handler.initialize(context)
            for size in sizes:
                # Two intra-op threads collapse when anything else wants a core for a moment.
                since = me.read()
                rows = [measure(handler, context, requests, size, plan.seconds / REPEATS) for _ in range(REPEATS)]
                others = _others_cpu(since, me)
                if plan.wait_quiet_s > 0 and others > NOISY_OTHERS_PCT:
                    progress(f"in-process: other processes used {others:.0f}% CPU meanwhile: measuring again")
                    paused = time.perf_counter()
                    resources.wait_for_quiet(plan.wait_quiet_s, progress)
                    began += time.perf_counter() - paused
                    rows += [measure(handler, context, requests, size, plan.seconds / REPEATS) for _ in range(REPEATS)]
                row = max(rows, key=lambda r: r.items_per_s)
                service = 1000.0 * size / row.items_per_s
                points.append(FitPoint(count, size, service))
                progress(f"in-process: {count} thread(s), batch {size}: s(b) = {service:.1f} ms "
                         f"({row.items_per_s:.1f} items/s)")
                if service > plan.slo_ms:
                    progress(f"in-process: one batch of {size} already exceeds the {plan.slo_ms:g} ms SLO: "
                             "larger batches not measured")
                    break
            del handler, context
            gc.collect()
    return {"points": [p.to_json() for p in points], "seconds": round(time.perf_counter() - began, 2)}


