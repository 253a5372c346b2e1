"""Load for the reliability checks, with exact accounting: every request sent is answered or lost.

Built on the benchmark's load generator (benchmarks.load.loadgen: keep-alive connections, closed and
open loop) and its arithmetic (benchmarks.load.stats). Adds what the checks need on top:
- `Traffic`: sent / answered / ok / lost (no HTTP answer within the timeout, or never came back);
- `ClosedLoop`: clients in background threads that a check starts, injects a fault under, and stops;
- `capacity`: the closed-loop throughput a model sustains, which the overload and soak scale from;
- `rss_probe`: resident memory of the frontend and of the workers, for the load generator's probe;
- `others_meter`: the CPU every other process on the machine used meanwhile (a shared machine's
  noise: figures taken while it is high say more about the neighbours than about the server).
Everything is bounded: runs end after a fixed number of windows, requests after their timeout.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from benchmarks.load import loadgen, stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.resources import FRONTEND, OTHERS, WORKERS, ProcessGroups, usage
from benchmarks.load.stats import NO_RESPONSE, Sample, StabilityRule
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe

REQUEST_TIMEOUT_S = 60.0


def say(line: str) -> None:
    print(f"[reliability] {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Traffic:
    """What happened to the requests of one check."""

    sent: int = 0
    answered: int = 0  # an HTTP status came back (success or error) within the timeout
    ok: int = 0
    errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # status -> count

    @property
    def lost(self) -> int:
        return self.sent - self.answered

    @classmethod
    def of(cls, samples: Iterable[Sample], sent: int | None = None) -> Traffic:
        samples = list(samples)
        answered = [s for s in samples if s.status != NO_RESPONSE]
        errors = {k: v for k, v in stats.errors_by_status(answered).items()}
        return cls(len(samples) if sent is None else sent, len(answered), sum(1 for s in answered if s.ok),
                   MappingProxyType(errors))

    def __add__(self, other: Traffic) -> Traffic:
        errors: dict[str, int] = dict(self.errors)
        for status, count in other.errors.items():
            errors[status] = errors.get(status, 0) + count
        return Traffic(self.sent + other.sent, self.answered + other.answered, self.ok + other.ok,
                       MappingProxyType(dict(sorted(errors.items()))))

    def describe(self) -> str:
        errors = ", ".join(f"{n}x{s}" for s, n in self.errors.items()) or "none"
        return f"{self.sent} sent, {self.answered} answered ({self.ok} ok; errors: {errors}), {self.lost} lost"


def target(ts: TorchServe, model: str, timeout_s: float = REQUEST_TIMEOUT_S) -> loadgen.Target:
    return loadgen.Target.for_model(ts.inference_url, model, ts.tokens.inference, timeout_s)


def payloads(model: str) -> tuple[loadgen.Payload, ...]:
    """Real inputs: the photos as JPEG, or the sentences as JSON."""
    return loadgen.payloads_for(model)


def fixed_windows(count: int, warmup: int = 0) -> StabilityRule:
    """A run of exactly warmup + count windows (the stability rule never ends it early)."""
    return StabilityRule(tolerance_pct=1e9, last=count, max_windows=count, warmup=warmup)


def batch_size(ts: TorchServe, model: str) -> int:
    return int(ts.describe(model)["batchSize"])


def capacity(ts: TorchServe, model: str, seconds: float = 8.0, concurrency: int | None = None) -> float:
    """Successful requests per second at 2 x batchSize clients (closed loop), after a warm-up window."""
    clients = concurrency or 2 * batch_size(ts, model)
    window_s = seconds / 4
    say(f"measuring the capacity of {model}: {clients} clients, {seconds:.0f} s")
    result = loadgen.closed_loop(target(ts, model), payloads(model), clients, fixed_windows(3, warmup=1),
                                 window_s, progress=lambda line: None)
    rps = result.figures()["throughput_rps"]
    if not rps or rps <= 0:
        raise BenchmarkError(f"{model}: no request succeeded while measuring capacity "
                               f"({stats.errors_by_status(result.samples)})")
    say(f"capacity of {model}: {rps:.1f} req/s")
    return rps


def rss_probe(ts: TorchServe, models: Sequence[str]) -> Callable[[], Mapping[str, int]]:
    """A probe reading the RSS (bytes) of the frontend and of all workers of `models`, summed."""
    pids = [pid for model in models for pid in ts.worker_pids(model)]
    groups = ProcessGroups({FRONTEND: [ts.java_pid] if ts.java_pid else [], WORKERS: pids})

    def probe() -> Mapping[str, int]:
        reading = groups.read()
        return {FRONTEND: reading.rss_bytes[FRONTEND], WORKERS: reading.rss_bytes[WORKERS]}

    return probe


def others_meter(ts: TorchServe | RayServe) -> Callable[[], float]:
    """Start measuring; the returned function gives the CPU (% of one core) that processes other
    than the server (every process of a Ray cluster) and this generator used since."""
    if isinstance(ts, RayServe):
        groups = ProcessGroups.for_server(None, [p.pid for p in ts.processes()])
    else:
        groups = ProcessGroups.for_server(ts.java_pid, [pid for model in ts.list_models()
                                                        for pid in ts.worker_pids(model)])
    before = groups.read()
    return lambda: usage(before, groups.read())[OTHERS].cpu_pct


class ClosedLoop:
    """`concurrency` clients in background threads, each posting its next request as soon as the
    last one is answered, until `stop()`. Counts every request before it goes out."""

    def __init__(self, target_: loadgen.Target, payloads_: Sequence[loadgen.Payload], concurrency: int,
                 max_seconds: float) -> None:
        self.target = target_
        self.payloads = tuple(payloads_)
        self.samples: list[Sample] = []
        self._sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline = time.perf_counter() + max_seconds  # bounded even if stop() is never called
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True, name=f"reliability-{i}")
                         for i in range(concurrency)]

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _client(self, index: int) -> None:
        conn = loadgen.Connection(self.target)
        k = index
        try:
            while not self._stop.is_set() and time.perf_counter() < self._deadline:
                payload = self.payloads[k % len(self.payloads)]
                k += len(self._threads)
                with self._lock:
                    self._sent += 1
                sent = time.perf_counter()
                status = conn.post(payload)
                with self._lock:
                    self.samples.append(Sample(sent, sent, time.perf_counter(), status))
        finally:
            conn.close()

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def stop(self) -> Traffic:
        """Stop sending; wait for the requests in flight (each bounded by its timeout)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.target.timeout_s + 10)
        with self._lock:
            return Traffic.of(self.samples, sent=self._sent)
