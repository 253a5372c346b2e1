"""The load generator: closed-loop concurrency sweep and open-loop Poisson arrivals.

Light on purpose (it shares the cores with the server): one thread and one keep-alive
`http.client` connection per concurrent request, bodies encoded once, nothing parsed from the
answers but the status. Every point runs in windows until the stability rule holds (or the window
budget is spent); `probe()` is called at every window edge so the caller can read server metrics
and process usage over exactly the windows a point reports.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional
from urllib.parse import urlsplit

from benchmarks.load import inputs, stats
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.stats import NO_RESPONSE, Sample, StabilityRule, Window

Probe = Callable[[], Any]
Progress = Callable[[str], None]
# More request headers from a request's intended send time (time.perf_counter()): a client's deadline, say.
Stamp = Callable[[float], Mapping[str, str]]
# A request that starts more than this after its intended time counts as sent late.
LATE_S = 0.010


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    token: str
    timeout_s: float = 60.0

    @classmethod
    def for_model(cls, inference_url: str, model: str, token: str, timeout_s: float = 60.0) -> Target:
        parts = urlsplit(inference_url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, f"/predictions/{model}", token, timeout_s)


@dataclass(frozen=True)
class Payload:
    body: bytes
    content_type: str
    # A traffic mix sends each payload to its own model: its path (else the target's) and a tag
    # its samples carry (benchmarks/load/mix.py splits the figures by it).
    path: str = ""
    tag: str = ""
    headers: tuple[tuple[str, str], ...] = ()  # more request headers (Cache-Control, say)


def payloads_for(model: str) -> tuple[Payload, ...]:
    """The model's catalogue examples, the inputs the in-process limit uses too."""
    return tuple(Payload(r.body, r.content_type) for r in inputs.requests(model))


class Connection:
    """One keep-alive HTTP/1.1 connection, reopened after any failure."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._conn: Optional[http.client.HTTPConnection] = None
        self._aborted = False
        self._headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}

    def post(self, payload: Payload, extra: Optional[Mapping[str, str]] = None) -> int:
        """The HTTP status, or NO_RESPONSE. A stale keep-alive connection is retried once."""
        for attempt in (0, 1):
            reused = self._conn is not None
            try:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.target.host, self.target.port,
                                                            timeout=self.target.timeout_s)
                headers = {**self._headers, **dict(payload.headers), **(extra or {}), "Content-Type": payload.content_type}
                self._conn.request("POST", payload.path or self.target.path, payload.body, headers)
                response = self._conn.getresponse()
                response.read()
                if response.will_close:
                    self.close()
                return response.status
            except (OSError, http.client.HTTPException):
                self.close()
                if not reused or attempt or self._aborted:
                    return NO_RESPONSE
        return NO_RESPONSE

    def abort(self) -> None:
        """Cut a request in flight from another thread: its post() returns NO_RESPONSE."""
        self._aborted = True
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(frozen=True)
class LoadResult:
    """One load point: every sample, the windows, and the probe readings at the window edges."""

    mode: str  # "closed" | "open"
    level: float  # concurrency, or the nominal Poisson rate (req/s)
    samples: tuple[Sample, ...]
    windows: tuple[Window, ...]
    edges: tuple[tuple[float, Any], ...]  # (time, probe()) at the start and end of every window
    stable: bool
    rule: StabilityRule
    connections: int
    max_busy: int = 0
    dispatch_lag_p99_ms: Optional[float] = None

    @property
    def reported_edges(self) -> tuple[tuple[float, Any], tuple[float, Any]]:
        """Probe readings at the start and the end of the reported windows."""
        return self.edges[len(self.windows) - self.rule.last], self.edges[len(self.windows)]

    @property
    def interval(self) -> tuple[float, float]:
        first, last = self.reported_edges
        return first[0], last[0]

    @property
    def window_s(self) -> float:
        """One window's length (every window of a point has the same)."""
        last = self.windows[-1]
        return last.end - last.start

    def selection(self) -> stats.Selection:
        """The requests the point's latency figures are over (stats.select: for the open loop those
        scheduled in the reported windows, answered or not)."""
        start, end = self.interval
        return stats.select(self.samples, self.mode, start, end, self.window_s)

    def figures(self) -> dict:
        """The point's client-side figures over its reported windows (latency from the intended send
        time, over `selection()`), and for the open loop the offered rate."""
        start, end = self.interval
        chosen = self.selection()
        offered, unanswered, carried_in = None, 0, 0
        if self.mode == "open":
            rates = stats.open_loop_rates(self.samples, start, end)
            offered, unanswered, carried_in = rates.offered_rps, rates.unanswered, rates.carried_in
        latency = stats.summarize(chosen.latencies_s)
        reported = self.windows[len(self.windows) - self.rule.last:]
        return {
            "mode": self.mode,
            "level": self.level,
            "seconds": end - start,
            "windows": len(self.windows),
            # The spread of the point: each reported window's own p99, and how many answers each had.
            "window_p99_ms": [w.p99_ms for w in reported],
            "window_ok": [w.ok for w in reported],
            "stable": self.stable,
            "requests": len(chosen.requests),
            "ok": sum(1 for s in chosen.requests if s.ok),
            "errors": chosen.errors,
            "throughput_rps": stats.throughput(self.samples, start, end),
            "nominal_rps": self.level if self.mode == "open" else None,
            "offered_rps": offered,
            "unanswered": unanswered,
            "carried_in": carried_in,
            "latency_ms": None if latency is None else asdict(latency),
            "late_fraction": stats.late_fraction(chosen.requests, LATE_S) if self.mode == "open" else 0.0,
            "connections": self.connections,
            "warnings": list(self.warnings()),
        }

    def warnings(self) -> tuple[str, ...]:
        if self.mode != "open":
            return () if self.stable else (f"not stable after {len(self.windows)} windows",)
        out = [] if self.stable else [f"not stable after {len(self.windows)} windows"]
        late = stats.late_fraction(self.selection().requests, LATE_S)
        if self.dispatch_lag_p99_ms is not None and self.dispatch_lag_p99_ms > LATE_S * 1000:
            out.append(f"the generator could not keep up: its p99 dispatch lag was "
                       f"{self.dispatch_lag_p99_ms:.1f} ms (latencies include it)")
        if self.max_busy >= self.connections and late > 0.01:
            out.append(f"all {self.connections} connections were busy and {late:.0%} of requests went out "
                       f">{LATE_S * 1000:.0f} ms late: the offered rate is past what the server sustains "
                       "(the waits count in latency)")
        return tuple(out)


def _drive(rule: StabilityRule, window_s: float, samples: list[Sample], probe: Probe, progress: Progress,
           label: str) -> tuple[list[Window], list[tuple[float, Any]], bool]:
    """Run windows until the rule is satisfied; the load itself runs in other threads."""
    start = time.perf_counter()
    edges = [(start, probe())]
    windows: list[Window] = []
    failing = 0
    while not rule.finished(windows):
        time.sleep(max(0.0, start + window_s - time.perf_counter()))
        end = time.perf_counter()
        current = stats.window(list(samples), start, end)
        edges.append((end, probe()))
        windows.append(current)
        tag = "warm-up" if len(windows) <= rule.warmup else f"window {len(windows) - rule.warmup}"
        bad = current.completed - current.ok
        progress(f"    {label} {tag}: {current.throughput_rps:.1f} req/s, {stats.tail_text(current.latency, 0)}"
                 + (f", {bad} errors" if bad else ""))
        failing = failing + 1 if current.completed and not current.ok else 0
        if failing >= 2:
            codes = stats.errors_by_status(s for s in samples if start <= s.done < end)
            raise BenchmarkError(f"{label}: every request failed for two windows (statuses {codes})")
        start = end
    return windows, edges, rule.is_stable(windows)


def _nothing() -> None:
    return None


def _settle_heap() -> None:
    """Freeze what is alive before a point: a full collection of this process mid-point would
    delay every sender and count as server latency."""
    gc.collect()
    gc.freeze()


def closed_loop(target: Target, payloads: Sequence[Payload], concurrency: int, rule: StabilityRule,
                window_s: float, probe: Probe = _nothing, progress: Progress = print) -> LoadResult:
    """`concurrency` clients, each sending its next request as soon as the last one is answered."""
    _settle_heap()
    stop = threading.Event()
    samples: list[Sample] = []

    def client(index: int) -> None:
        conn = Connection(target)
        k = index
        try:
            while not stop.is_set():
                payload = payloads[k % len(payloads)]
                k += concurrency
                sent = time.perf_counter()
                status = conn.post(payload)
                samples.append(Sample(sent, sent, time.perf_counter(), status))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True, name=f"closed-{i}")
               for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        windows, edges, stable = _drive(rule, window_s, samples, probe, progress, f"c={concurrency}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=target.timeout_s + 5)
    return LoadResult("closed", concurrency, tuple(samples), tuple(windows), tuple(edges), stable, rule,
                      concurrency, max_busy=concurrency)


def poisson_schedule(rate: float, seed: int = 0) -> Iterator[float]:
    """Arrival offsets (s) of a Poisson process: independent clients, together `rate` req/s."""
    rng = random.Random(seed)
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        yield offset


def open_loop(target: Target, payloads: Sequence[Payload], rate: float, rule: StabilityRule, window_s: float,
              connections: int = 64, seed: int = 0, drain_s: float = 30.0, probe: Probe = _nothing,
              progress: Progress = print, stamp: Optional[Stamp] = None) -> LoadResult:
    """Poisson arrivals at `rate` req/s, sent by up to `connections` concurrent clients.

    Latency runs from each request's scheduled arrival, whatever delayed its sending. After the
    last window no new arrivals are scheduled; those already scheduled get `drain_s` to be answered,
    then count as failed (status NO_RESPONSE). `stamp`: more headers per request from its scheduled
    arrival (a client's deadline, benchmarks/reliability/deadlines.py).
    """
    if rate <= 0:
        raise BenchmarkError(f"open-loop rate must be > 0, got {rate}")
    _settle_heap()
    stop = threading.Event()
    pending: queue.SimpleQueue[Optional[tuple[float, Payload]]] = queue.SimpleQueue()
    samples: list[Sample] = []
    lags: list[float] = []
    busy = [0, 0]  # now, most at once
    lock = threading.Lock()
    deadline = [float("inf")]

    def dispatcher() -> None:
        offsets = poisson_schedule(rate, seed)
        start = time.perf_counter()
        k = 0
        due = start + next(offsets)
        while not stop.is_set():
            wait = due - time.perf_counter()
            if wait > 0 and stop.wait(wait):
                break
            lags.append(time.perf_counter() - due)
            pending.put((due, payloads[k % len(payloads)]))
            k += 1
            due = start + next(offsets)

    def sender(conn: Connection) -> None:
        try:
            while (item := pending.get()) is not None:
                intended, payload = item
                sent = time.perf_counter()
                if sent > deadline[0]:
                    samples.append(Sample(intended, sent, sent, NO_RESPONSE, payload.tag))  # never sent: failed
                    continue
                with lock:
                    busy[0] += 1
                    busy[1] = max(busy)
                status = conn.post(payload, None if stamp is None else stamp(intended))
                samples.append(Sample(intended, sent, time.perf_counter(), status, payload.tag))
                with lock:
                    busy[0] -= 1
        finally:
            conn.close()

    conns = [Connection(target) for _ in range(connections)]
    senders = [threading.Thread(target=sender, args=(c,), daemon=True, name=f"open-{i}") for i, c in enumerate(conns)]
    for thread in senders:
        thread.start()
    source = threading.Thread(target=dispatcher, daemon=True, name="open-dispatch")
    source.start()
    try:
        windows, edges, stable = _drive(rule, window_s, samples, probe, progress, f"{rate:g} req/s")
    finally:
        stop.set()
        source.join()
        deadline[0] = time.perf_counter() + drain_s
        for _ in senders:
            pending.put(None)
        for thread in senders:
            thread.join(timeout=max(0.0, deadline[0] - time.perf_counter()))
        for conn in conns:  # answers still missing at the deadline count as "no response"
            conn.abort()
        for thread in senders:
            thread.join(timeout=5)
    ordered = sorted(lags)
    lag_p99 = stats.percentile(ordered, 99.0) * 1000 if ordered else None
    return LoadResult("open", rate, tuple(samples), tuple(windows), tuple(edges), stable, rule, connections,
                      max_busy=busy[1], dispatch_lag_p99_ms=lag_p99)


def concurrency_levels(max_concurrency: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_concurrency (included when it is not a power of two)."""
    levels, level = [], 1
    while level < max_concurrency:
        levels.append(level)
        level *= 2
    return tuple(levels) + (max_concurrency,)


def gained(throughputs: Sequence[float], min_gain_pct: float) -> bool:
    """Did the last point beat the best one before it by more than min_gain_pct?"""
    if len(throughputs) < 2:
        return True
    return throughputs[-1] > max(throughputs[:-1]) * (1.0 + min_gain_pct / 100.0)


def closed_sweep(levels: Sequence[int], run_level: Callable[[int], LoadResult],
                 min_gain_pct: Optional[float] = 5.0, progress: Progress = print) -> list[LoadResult]:
    """Closed-loop points at rising concurrency, until throughput stops rising by > min_gain_pct
    (min_gain_pct None: run every level). `run_level(c)` measures one point (closed_loop, with
    whatever the caller does around it)."""
    results: list[LoadResult] = []
    for level in levels:
        progress(f"  closed loop, concurrency {level}")
        results.append(run_level(level))
        throughputs = [r.figures()["throughput_rps"] for r in results]
        if min_gain_pct is not None and not gained(throughputs, min_gain_pct):
            progress(f"  throughput rose by <= {min_gain_pct:g}% from the best before: sweep done")
            break
    return results
