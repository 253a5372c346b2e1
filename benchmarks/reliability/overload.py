"""Overload: three times a model's measured capacity, for a bounded time, on a small job queue.

Checked: once the queue (job_queue_size, written into the test server's config.properties) is
full the frontend answers 503 at once instead of queueing without end; the requests it accepts
keep a p99 bounded by the queue's length over the capacity; memory (RSS of the frontend and the
workers) stays bounded; every request gets an answer; and afterwards the server is healthy (queue
drained, same workers, requests succeed).

    python -m benchmarks overload --factor 3 --seconds 20 --job-queue-size 16 [--engine torchserve,ray]

With both engines, each gets a fresh server of the same model and queue in turn; the run writes a
report with the engines side by side (benchmarks/reliability/overload_report.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from benchmarks.load import cli, loadgen, stats
from benchmarks.load.resources import FRONTEND, WORKERS, ProcessGroups
from benchmarks.load.traffic import (
    Traffic,
    batch_size,
    capacity,
    fixed_windows,
    others_meter,
    payloads,
    rss_probe,
    say,
    target,
)
from benchmarks.reliability import soak
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ServerConfig

# Memory may rise with a burst (buffers, JVM heap) but not without bound: peak RSS during the
# overload at most this much above the RSS just before it, per process group.
RSS_BOUND_PCT = MappingProxyType({FRONTEND: 50.0, WORKERS: 25.0})
DRAIN_S = 30.0
# Under overload the frontend's rejections and the load generator share the cores with the model, so
# it serves less than its capacity; below this share of it, that is a collapse, not a slowdown.
MIN_SERVED_SHARE = 0.2


@dataclass(frozen=True)
class OverloadResult(cli.Checked):
    model: str
    capacity_rps: float
    offered_rps: float
    seconds: float
    job_queue_size: int
    traffic: Traffic
    p99_ok_ms: Optional[float]
    p99_bound_ms: float
    rss_before: Mapping[str, int]
    rss_peak: Mapping[str, int]
    healthy_after: tuple[str, ...]  # problems found after the overload (empty: healthy)
    others_cpu_pct: float = 0.0  # CPU other processes on the machine used meanwhile (% of one core)
    accepted: Optional[stats.LatencySummary] = None  # the accepted requests' latencies (p99_ok_ms's)
    served_rps: Optional[float] = None  # 200s per second of the run: the rate the queue drained at
    engine: str = "torchserve"
    refused: Optional[stats.LatencySummary] = None  # the 503s' latencies: what a refusal costs a client
    # Per second of scheduled arrivals: (second, 200s, accepted p99 ms, 503s, refused p99 ms).
    timeline: tuple[tuple[int, int, Optional[float], int, Optional[float]], ...] = ()

    @property
    def accepted_tail(self) -> str:
        """The accepted p99 as a report prints it (stats.tail_text)."""
        return stats.tail_text(self.accepted or {"count": None, "p99_ms": self.p99_ok_ms}, 0)

    @property
    def rejected_503(self) -> int:
        return self.traffic.errors.get("503", 0)

    def rss_growth_pct(self, group: str) -> float:
        before = self.rss_before[group]
        return 100.0 * (self.rss_peak[group] - before) / before if before else 0.0

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if not self.rejected_503:
            out.append(f"no 503 at {self.offered_rps:.0f} req/s: the queue of {self.job_queue_size} never filled")
        other = {s: n for s, n in self.traffic.errors.items() if s != "503"}
        if other:
            out.append(f"errors other than 503: {other}")
        if self.traffic.lost:
            out.append(f"{self.traffic.lost} requests got no answer")
        if self.served_rps is not None and self.served_rps < MIN_SERVED_SHARE * self.capacity_rps:
            out.append(f"served {self.served_rps:.1f} req/s under overload, under {MIN_SERVED_SHARE:.0%} of the "
                       f"capacity {self.capacity_rps:.1f} req/s: throughput collapsed")
        if self.p99_ok_ms is None:
            out.append("no request was accepted")
        elif self.p99_ok_ms > self.p99_bound_ms:
            out.append(f"accepted p99 {self.p99_ok_ms:.0f} ms over the bound of {self.p99_bound_ms:.0f} ms")
        for group, bound in RSS_BOUND_PCT.items():
            if self.rss_growth_pct(group) > bound:
                out.append(f"{group} RSS grew {self.rss_growth_pct(group):.0f}% (bound {bound:.0f}%)")
        return tuple(out) + self.healthy_after

    def summary(self) -> str:
        rss = ", ".join(f"{g} {self.rss_before[g] / 2**20:.0f}->{self.rss_peak[g] / 2**20:.0f} MB" for g in RSS_BOUND_PCT)
        return (f"overload {self.model}: {self.offered_rps:.0f} req/s offered for {self.seconds:.0f} s "
                f"({self.offered_rps / self.capacity_rps:.1f}x capacity {self.capacity_rps:.1f} req/s, "
                f"job queue {self.job_queue_size}): {self.traffic.describe()}; {self.rejected_503} x 503; "
                f"accepted {self.accepted_tail} (p99 bound {self.p99_bound_ms:.0f} ms"
                + (f" at the served {self.served_rps:.1f} req/s" if self.served_rps is not None else "")
                + f"); peak RSS {rss}; "
                f"healthy after: {'yes' if not self.healthy_after else 'NO'}; other processes used "
                f"{self.others_cpu_pct:.0f}% CPU meanwhile")


def p99_bound_ms(ahead: int, capacity_rps: float) -> float:
    """An accepted request waits behind at most `ahead` requests (the queue and the batches in
    progress): twice that drain time at the measured capacity, plus half a second of slack."""
    return 1000.0 * (2.0 * ahead / capacity_rps + 0.5)


def queue_and_ahead(server: TorchServe | RayServe, model: str) -> tuple[int, int, int]:
    """(job_queue_size, batch size, requests an accepted one may wait behind). TorchServe holds the
    queue and a batch in progress; a Ray replica holds Serve's ongoing slots (the queue and a batch)
    and as many again waiting for a slot (serving/ray/routes_config.py)."""
    if isinstance(server, RayServe):
        batch = next(a.settings.batch_size for a in server.apps if a.model == model)
        queue = server.limits.job_queue_size
        limits = server.limits.replica_limits(batch)
        return queue, batch, limits["max_ongoing_requests"] + limits["max_queued_requests"] + batch
    queue = int(server.config.get("job_queue_size", "100") or 100)
    batch = batch_size(server, model)
    return queue, batch, queue + 2 * batch


def memory_probe(server: TorchServe | RayServe, model: str):
    """RSS of the model's workers and of the rest of the server (TorchServe's frontend; every other
    process of a Ray cluster: ingress, HAProxy, Serve's controller and Ray's daemons)."""
    if not isinstance(server, RayServe):
        return rss_probe(server, [model])
    workers = server.worker_pids(model)
    groups = ProcessGroups({FRONTEND: [p.pid for p in server.processes() if p.pid not in workers],
                            WORKERS: list(workers)})

    def probe() -> Mapping[str, int]:
        reading = groups.read()
        return {FRONTEND: reading.rss_bytes[FRONTEND], WORKERS: reading.rss_bytes[WORKERS]}

    return probe


def timeline(samples: Sequence[stats.Sample]) -> tuple[tuple[int, int, Optional[float], int, Optional[float]], ...]:
    if not samples:
        return ()
    start = min(s.intended for s in samples)
    rows = []
    for second in range(int(max(s.intended for s in samples) - start) + 1):
        inside = [s for s in samples if int(s.intended - start) == second]
        ok = stats.summarize(s.latency for s in inside if s.ok)
        refused = stats.summarize(s.latency for s in inside if s.status == 503)
        rows.append((second, ok.count if ok else 0, ok.p99_ms if ok else None,
                     refused.count if refused else 0, refused.p99_ms if refused else None))
    return tuple(rows)


def overload(ts: TorchServe | RayServe, model: str, capacity_rps: float, factor: float = 3.0, seconds: float = 15.0,
             window_s: float = 3.0, connections: int = 96) -> OverloadResult:
    job_queue_size, batch, ahead = queue_and_ahead(ts, model)
    pids = ts.worker_pids(model)
    probe = memory_probe(ts, model)
    rss_before = probe()
    rate = factor * capacity_rps
    windows = max(1, round(seconds / window_s))
    say(f"overload {model}: {rate:.0f} req/s ({factor:g}x capacity) for {windows * window_s:.0f} s, "
        f"job queue {job_queue_size}")
    others = others_meter(ts)
    run = loadgen.open_loop(target(ts, model, timeout_s=60.0), payloads(model), rate, fixed_windows(windows),
                            window_s, connections=connections, drain_s=DRAIN_S, probe=probe,
                            progress=lambda line: say(line.strip()))
    peak = {g: max([rss_before[g]] + [reading[g] for _, reading in run.edges]) for g in RSS_BOUND_PCT}
    latency = stats.summarize(s.latency for s in run.samples if s.ok)
    served = sum(1 for s in run.samples if s.ok) / (windows * window_s)
    # The queue drains at the rate the server keeps up under the overload, not at the capacity
    # measured on a calm machine before it.
    drain_rps = max(min(capacity_rps, served), MIN_SERVED_SHARE * capacity_rps)
    return OverloadResult(
        model, capacity_rps, rate, windows * window_s, job_queue_size, Traffic.of(run.samples),
        None if latency is None else latency.p99_ms, p99_bound_ms(ahead, drain_rps),
        MappingProxyType(dict(rss_before)), MappingProxyType(peak), health_after(ts, model, pids, batch), others(),
        latency, served, "ray" if isinstance(ts, RayServe) else "torchserve",
        stats.summarize(s.latency for s in run.samples if s.status == 503), timeline(run.samples),
    )


def health_after(ts: TorchServe | RayServe, model: str, pids: tuple[int, ...], count: int,
                 drain_s: float = DRAIN_S) -> tuple[str, ...]:
    """Problems after the overload: queue not drained (TorchServe's management API tells; Serve has
    none, and the requests after it must succeed), workers replaced, requests failing."""
    problems = []
    if isinstance(ts, TorchServe):
        deadline = time.monotonic() + drain_s
        while ts.describe(model)["jobQueueStatus"]["pendingRequests"] and time.monotonic() < deadline:
            time.sleep(0.25)
        pending = ts.describe(model)["jobQueueStatus"]["pendingRequests"]
        if pending:
            problems.append(f"{pending} requests still queued {drain_s:.0f} s after the overload")
    if ts.client.ping(timeout_s=10).status_code != 200:
        problems.append("/ping is not 200 after the overload")
    if ts.worker_pids(model) != pids:
        problems.append(f"workers changed under overload: {pids} -> {ts.worker_pids(model)}")
    conn = loadgen.Connection(target(ts, model, timeout_s=30.0))
    try:
        statuses = [conn.post(p) for p in (payloads(model) * count)[:count]]
    finally:
        conn.close()
    if any(s != 200 for s in statuses):
        problems.append(f"requests after the overload answered {statuses}")
    return tuple(problems)


def server(engine: str, store, model: str, job_queue_size: int) -> TorchServe | RayServe:
    """A fresh server of `model` alone with this job queue, on `engine`, with config.properties' values."""
    if engine == "ray":
        shipped = ServerConfig.load(DEFAULT_CONFIG)
        settings = {model: shipped.model(model).settings} if model in shipped.model_names else {}
        return RayServe(store, models=(model,), settings=settings, job_queue_size=job_queue_size)
    # The soak's pre-touched JVM heap: otherwise the frontend's RSS "grows" by faulting in heap pages
    # it already owns under the burst, which is not the growth the check bounds.
    return TorchServe(store, load=(model,), extra_properties={"job_queue_size": str(job_queue_size),
                                                                **soak.soak_vmargs()})


def main(argv: Sequence[str]) -> int:
    from benchmarks.reliability import overload_report

    p = cli.parser("overload", __doc__.split("\n\n")[0])
    cli.add(p, "model", "model_store", "out", factor={"default": 3.0}, seconds={"default": 20.0},
            job_queue_size={"default": 16})
    p.add_argument("--engine", type=cli.engines, default=("torchserve",),
                   help=f"the engines to overload, one after the other ({', '.join(cli.ENGINES)}, comma-separated)")
    args = p.parse_args(argv)
    model = cli.model_or_first(args.model)
    results = []
    for engine in args.engine:
        with server(engine, args.model_store, model, args.job_queue_size) as running:
            queue, batch, _ = queue_and_ahead(running, model)
            # As many closed-loop clients as the server holds: fewer leave it idle between requests and
            # understate its capacity ("3x" is then no overload); more get 503s.
            rps = capacity(running, model, concurrency=queue + batch)
            results.append(overload(running, model, rps, args.factor, args.seconds))
    report = overload_report.write(cli.report_folder(args.out, "overload", model), results,
                                   cli.command_line("overload", argv))
    return cli.verdict(*results, report=report)
