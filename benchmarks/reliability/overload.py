"""Overload: three times a model's measured capacity, for a bounded time, on a small job queue.

Checked: once the queue (job_queue_size, written into the test server's config.properties) is
full the frontend answers 503 at once instead of queueing without end; the requests it accepts
keep a p99 bounded by the queue's length over the capacity; memory (RSS of the frontend and the
workers) stays bounded; every request gets an answer; and afterwards the server is healthy (queue
drained, same workers, requests succeed).

    python -m benchmarks overload --factor 3 --seconds 20 --job-queue-size 16
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from benchmarks.load import cli, loadgen, stats
from benchmarks.load.resources import FRONTEND, WORKERS
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
from serving.launcher import TorchServe

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


def p99_bound_ms(job_queue_size: int, batch: int, capacity_rps: float) -> float:
    """An accepted request waits behind at most the queue and the batches in progress: twice
    that drain time at the measured capacity, plus half a second of slack."""
    return 1000.0 * (2.0 * (job_queue_size + 2 * batch) / capacity_rps + 0.5)


def overload(ts: TorchServe, model: str, capacity_rps: float, factor: float = 3.0, seconds: float = 15.0,
             window_s: float = 3.0, connections: int = 96) -> OverloadResult:
    job_queue_size = int(ts.config.get("job_queue_size", "100") or 100)
    batch = batch_size(ts, model)
    pids = ts.worker_pids(model)
    probe = rss_probe(ts, [model])
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
        None if latency is None else latency.p99_ms, p99_bound_ms(job_queue_size, batch, drain_rps),
        MappingProxyType(dict(rss_before)), MappingProxyType(peak), health_after(ts, model, pids, batch), others(),
        latency, served,
    )


def health_after(ts: TorchServe, model: str, pids: tuple[int, ...], count: int, drain_s: float = DRAIN_S) -> tuple[str, ...]:
    """Problems after the overload: queue not drained, workers replaced, requests failing."""
    problems = []
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


def main(argv: Sequence[str]) -> int:
    p = cli.parser("overload", __doc__.split("\n\n")[0])
    cli.add(p, "model", "model_store", factor={"default": 3.0}, seconds={"default": 20.0},
            job_queue_size={"default": 16})
    args = p.parse_args(argv)
    model = cli.model_or_first(args.model)
    with TorchServe(args.model_store, load=(model,),
                    extra_properties={"job_queue_size": str(args.job_queue_size)}) as ts:
        return cli.verdict(overload(ts, model, capacity(ts, model), args.factor, args.seconds))
