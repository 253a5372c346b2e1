"""The tuner's search space: per-model frontend values plus the workers' thread budget.

A candidate is what one TorchServe model runs with: `workers` workers, each using `threads`
intra-op threads, batches of up to `batch_size` requests formed within `max_batch_delay_ms`.

Threads are not a free dimension here. The handler's runtime setting `threads` lives in the
archive's model-config.yaml (an archive setting, not a config.properties key); left at null it
means physical cores / workers of that model, decided at worker start. The tuner writes only
config.properties, so a candidate's threads are always that auto budget, and workers x threads
never exceeds the cores by construction. Pinning another thread count means setting
`runtime.threads` in catalogue.yaml and rebuilding, which the tuner reports but never does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from benchmarks.tune.errors import TuneError
from serving.ts_config import ModelSettings

MAX_BATCH_SIZE = 512
# TorchServe 0.12 (Model.pollInferJob) stops filling a batch once its remaining delay is <= 0:
# with maxBatchDelay 0 a batch holds at most 2 requests even when the queue is full. 1 ms is the
# smallest delay that still drains a backed-up queue into full batches.
MIN_DELAY_MS = 1
# TorchServe's own values when config.properties says nothing about a model.
TS_DEFAULT_BATCH_SIZE = 1
TS_DEFAULT_DELAY_MS = 100


def auto_threads(workers: int, cores: int) -> int:
    """The handler's rule (handlers.runtime.thread_budget with threads: null)."""
    return max(1, cores // max(1, workers))


@dataclass(frozen=True, order=True)
class Candidate:
    workers: int
    threads: int
    batch_size: int
    max_batch_delay_ms: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.threads < 1:
            raise TuneError(f"workers and threads must be >= 1: {self}")
        if not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise TuneError(f"batch size must be in 1..{MAX_BATCH_SIZE}: {self}")
        if self.max_batch_delay_ms < 0:
            raise TuneError(f"max batch delay must be >= 0: {self}")

    @property
    def key(self) -> str:
        return f"w{self.workers}-t{self.threads}-b{self.batch_size}-d{self.max_batch_delay_ms}"

    @property
    def behaviour(self) -> tuple[int, int, int, int]:
        """Candidates that behave the same share this: with batch size 1 the delay is never used."""
        delay = 0 if self.batch_size == 1 else self.max_batch_delay_ms
        return (self.workers, self.threads, self.batch_size, delay)

    @property
    def label(self) -> str:
        return (f"{self.workers} worker{'s' if self.workers > 1 else ''} x {self.threads} thread"
                f"{'s' if self.threads > 1 else ''}, batch {self.batch_size}, delay {self.max_batch_delay_ms} ms")

    def settings(self, response_timeout_s: int = 120) -> ModelSettings:
        return ModelSettings(batch_size=self.batch_size, max_batch_delay_ms=self.max_batch_delay_ms,
                             min_workers=self.workers, max_workers=self.workers,
                             response_timeout_s=response_timeout_s, threads=self.threads)

    def to_json(self) -> dict:
        return {"workers": self.workers, "threads": self.threads, "batch_size": self.batch_size,
                "max_batch_delay_ms": self.max_batch_delay_ms}

    @classmethod
    def from_json(cls, raw: dict) -> Candidate:
        return cls(int(raw["workers"]), int(raw["threads"]), int(raw["batch_size"]), int(raw["max_batch_delay_ms"]))


def torchserve_defaults(cores: int) -> Candidate:
    """TorchServe's defaults for a model config.properties says nothing about: batch 1, delay
    100 ms, one worker per CPU (default_workers_per_model unset); threads by our handler's rule."""
    return Candidate(cores, auto_threads(cores, cores), TS_DEFAULT_BATCH_SIZE, TS_DEFAULT_DELAY_MS)


@dataclass(frozen=True)
class Space:
    cores: int
    workers: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    delays_ms: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise TuneError(f"cores must be >= 1, got {self.cores}")
        if not self.workers or not self.batch_sizes or not self.delays_ms:
            raise TuneError("a search space needs at least one worker count, batch size and delay")
        bad = [w for w in self.workers if not 1 <= w <= self.cores]
        if bad:
            raise TuneError(f"workers {bad} outside 1..{self.cores} (the cores)")
        bad = [b for b in self.batch_sizes if not 1 <= b <= MAX_BATCH_SIZE]
        if bad:
            raise TuneError(f"batch sizes {bad} outside 1..{MAX_BATCH_SIZE}")
        bad = [d for d in self.delays_ms if d < MIN_DELAY_MS]
        if bad:
            raise TuneError(f"delays {bad} below {MIN_DELAY_MS} ms (TorchServe caps batches at 2 with delay 0)")

    def candidates(self) -> tuple[Candidate, ...]:
        """Every distinct candidate; batch size 1 appears once per worker count (no delay to tune)."""
        out = []
        for workers in sorted(set(self.workers)):
            threads = auto_threads(workers, self.cores)
            for batch in sorted(set(self.batch_sizes)):
                delays = (min(self.delays_ms),) if batch == 1 else sorted(set(self.delays_ms))
                out += [Candidate(workers, threads, batch, delay) for delay in delays]
        return tuple(out)

    @property
    def thread_counts(self) -> tuple[int, ...]:
        return tuple(sorted({auto_threads(w, self.cores) for w in self.workers}))

    @property
    def max_batch_size(self) -> int:
        return max(self.batch_sizes)

    def to_json(self) -> dict:
        return {"cores": self.cores, "workers": list(self.workers), "batch_sizes": list(self.batch_sizes),
                "delays_ms": list(self.delays_ms)}


# Named spaces. "full" is what `make tune` searches on CPUs; "gpu" on one GPU (--device cuda): batches
# far above a CPU's, a few workers sharing the GPU rather than one per core; "reduced" is a
# small one (1-2 workers, batch 1/2/4/8, delay 2/10/30 ms); "tiny" is the smoke test's.
PRESETS = {
    "full": {"batch_sizes": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32), "delays_ms": (1, 2, 5, 10, 20, 30, 50)},
    "gpu": {"batch_sizes": (1, 2, 4, 8, 16, 32, 64, 128, 256), "delays_ms": (1, 2, 5, 10, 20), "workers": (1, 2, 4)},
    "reduced": {"batch_sizes": (1, 2, 4, 8), "delays_ms": (2, 10, 30)},
    "tiny": {"batch_sizes": (1, 4), "delays_ms": (5,), "workers": (1,)},
}


def preset(name: str, cores: int, workers: Optional[Iterable[int]] = None,
           batch_sizes: Optional[Iterable[int]] = None, delays_ms: Optional[Iterable[int]] = None) -> Space:
    """A named space, with any dimension overridden."""
    if name not in PRESETS:
        raise TuneError(f"unknown space {name!r} (known: {', '.join(PRESETS)})")
    base = PRESETS[name]
    default_workers = [w for w in base.get("workers", ()) if w <= cores] or range(1, cores + 1)
    return Space(
        cores=cores,
        workers=tuple(workers or default_workers),
        batch_sizes=tuple(batch_sizes or base["batch_sizes"]),
        delays_ms=tuple(delays_ms or base["delays_ms"]),
    )
