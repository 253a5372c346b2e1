"""Overload with and without deadlines: twice a model's capacity offered, the same server, two runs.

One server with the model alone on the shipped job queue (100 requests); its capacity measured
(closed loop), then two open-loop runs of equal length at `factor` x that capacity: clients that send
no deadline, and clients whose every request carries a budget of twice the model's SLO
(`X-Request-Timeout-Ms`) counted from its intended send time (`X-Request-Start-Ms`:
TorchServe 0.12 does not tell the worker when its frontend received a request). A request whose
budget ran out in the queue is answered 504 without being computed, so the worker spends its time on
requests that can still be answered in time.

Reported per run: the p99 of the answered (200) requests, the share of all requests answered 200
within the budget (the same threshold judges both runs), the counts of 200 / 503 (queue full) / 504
(deadline) / other 5xx / lost, and the handler's HandlerDeadlineExpired counter. Checked: none lost,
no 5xx but 503 and 504, no 504 without deadlines. Written to benchmarks/reports/deadlines-<model>-<time>/
(report.md, report.json, deadlines.png).

    python -m benchmarks deadlines [--model minilm] [--factor 2] [--seconds 20]
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Optional

from benchmarks.load import cli, loadgen, stats
from benchmarks.load.environment import describe_environment
from benchmarks.load.server_metrics import Scrape
from benchmarks.load.stats import NO_RESPONSE, Sample
from benchmarks.load.traffic import Traffic, batch_size, capacity, fixed_windows, others_meter, payloads, say, target
from build.catalogue import Catalogue
from handlers.deadlines import START_HEADER, TIMEOUT_HEADER
from handlers.stage_metrics import DEADLINE_EXPIRED_METRIC
from serving.launcher import TorchServe
from serving.repo import CATALOGUE

JOB_QUEUE_SIZE = 100  # the shipped config.properties' job_queue_size
DRAIN_S = 30.0
OUTCOMES = ("200 in time", "200 late", "503", "504", "other 5xx", "4xx", "lost")


@dataclass(frozen=True)
class RunFigures:
    """One open-loop run: what became of its requests."""

    label: str
    sends_deadline: bool
    offered_rps: float
    seconds: float
    traffic: Traffic
    outcomes: Mapping[str, int]  # OUTCOMES -> requests
    answered: Optional[stats.LatencySummary]  # the 200s' latencies
    expired_counter: float  # HandlerDeadlineExpired over the run (from /metrics)
    ok_latencies_ms: tuple[float, ...]  # for the plot only

    @property
    def in_time_share(self) -> float:
        return self.outcomes["200 in time"] / self.traffic.sent if self.traffic.sent else 0.0

    def to_json(self) -> dict:
        return {"label": self.label, "sends_deadline": self.sends_deadline, "offered_rps": self.offered_rps,
                "seconds": self.seconds, "sent": self.traffic.sent, "outcomes": dict(self.outcomes),
                "in_time_share": self.in_time_share, "answered_ms": None if self.answered is None else self.answered.__dict__,
                "expired_counter": self.expired_counter}


@dataclass(frozen=True)
class DeadlineComparison(cli.Checked):
    model: str
    slo_ms: float
    budget_ms: int
    capacity_rps: float
    factor: float
    job_queue_size: int
    batch_size: int
    runs: tuple[RunFigures, RunFigures]  # without, with deadlines
    others_cpu_pct: float

    @property
    def traffic(self) -> Traffic:
        return self.runs[0].traffic + self.runs[1].traffic

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        for run in self.runs:
            if run.traffic.lost:
                out.append(f"deadlines, {run.label}: {run.traffic.lost} requests got no answer")
            if run.outcomes["other 5xx"]:
                out.append(f"deadlines, {run.label}: {run.outcomes['other 5xx']} answers 5xx other than 503/504")
        if self.runs[0].outcomes["504"]:
            out.append(f"deadlines: {self.runs[0].outcomes['504']} x 504 in the run without deadlines")
        return tuple(out)

    def summary(self) -> str:
        parts = []
        for run in self.runs:
            o = run.outcomes
            parts.append(f"{run.label}: {stats.tail_text(run.answered, 0)} of the 200s, {run.in_time_share:.0%} answered "
                         f"within {self.budget_ms} ms; {o['200 in time'] + o['200 late']} x 200, {o['503']} x 503, "
                         f"{o['504']} x 504, {o['other 5xx']} other 5xx, {o['lost']} lost")
        return (f"deadlines {self.model}: {self.runs[0].offered_rps:.0f} req/s offered ({self.factor:g}x capacity "
                f"{self.capacity_rps:.1f} req/s, job queue {self.job_queue_size}, budget {self.budget_ms} ms = 2x SLO) "
                f"for {self.runs[0].seconds:.0f} s each; " + "; ".join(parts))

    def to_json(self) -> dict:
        return {"model": self.model, "slo_ms": self.slo_ms, "budget_ms": self.budget_ms,
                "capacity_rps": self.capacity_rps, "factor": self.factor, "job_queue_size": self.job_queue_size,
                "batch_size": self.batch_size, "runs": [r.to_json() for r in self.runs],
                "others_cpu_pct": self.others_cpu_pct, "problems": list(self.problems)}


def deadline_stamp(budget_ms: int):
    """The headers a client with a deadline sends: its budget and its send time (Unix ms)."""
    wall_at_zero = time.time() - time.perf_counter()  # perf_counter times -> wall clock, read once

    def stamp(intended: float) -> Mapping[str, str]:
        return {TIMEOUT_HEADER: str(budget_ms), START_HEADER: str(int((wall_at_zero + intended) * 1000))}

    return stamp


def outcomes(samples: Sequence[Sample], budget_ms: float) -> dict[str, int]:
    out = dict.fromkeys(OUTCOMES, 0)
    for s in samples:
        if s.status == NO_RESPONSE:
            key = "lost"
        elif s.ok:
            key = "200 in time" if s.latency * 1000.0 <= budget_ms else "200 late"
        elif s.status in (503, 504):
            key = str(s.status)
        else:
            key = "other 5xx" if s.status >= 500 else "4xx"
        out[key] += 1
    return out


def wait_drained(ts: TorchServe, model: str) -> None:
    deadline = time.monotonic() + DRAIN_S
    while ts.describe(model)["jobQueueStatus"]["pendingRequests"] and time.monotonic() < deadline:
        time.sleep(0.25)


def expired_total(ts: TorchServe, model: str) -> float:
    return Scrape.of(ts.metrics_text()).total(DEADLINE_EXPIRED_METRIC, model)


def one_run(ts: TorchServe, model: str, rate: float, seconds: float, budget_ms: int, sends_deadline: bool,
            window_s: float, connections: int) -> RunFigures:
    label = "deadline" if sends_deadline else "no deadline"
    wait_drained(ts, model)
    before = expired_total(ts, model)
    windows = max(1, round(seconds / window_s))
    say(f"deadlines {model}, {label}: {rate:.0f} req/s for {windows * window_s:.0f} s")
    run = loadgen.open_loop(target(ts, model, timeout_s=60.0), payloads(model), rate, fixed_windows(windows), window_s,
                            connections=connections, drain_s=DRAIN_S, progress=lambda line: say(line.strip()),
                            stamp=deadline_stamp(budget_ms) if sends_deadline else None)
    wait_drained(ts, model)
    time.sleep(1.0)  # workers report metrics through their log stream, a moment after the answers
    ok = sorted(s.latency * 1000.0 for s in run.samples if s.ok)
    return RunFigures(label, sends_deadline, rate, windows * window_s, Traffic.of(run.samples),
                      MappingProxyType(outcomes(run.samples, budget_ms)),
                      stats.summarize(s.latency for s in run.samples if s.ok), expired_total(ts, model) - before,
                      tuple(ok))


def compare(ts: TorchServe, model: str, capacity_rps: float, factor: float = 2.0, seconds: float = 20.0,
            window_s: float = 2.0) -> DeadlineComparison:
    entry = Catalogue.load(CATALOGUE).entry(model)
    budget_ms = int(round(2 * entry.slo_ms))
    queue = int(ts.config.get("job_queue_size", str(JOB_QUEUE_SIZE)) or JOB_QUEUE_SIZE)
    batch = batch_size(ts, model)
    # Enough connections for a full queue plus the batches in progress: beyond that the frontend
    # answers 503 at once, so the generator never holds requests back itself.
    connections = queue + 4 * batch + 32
    others = others_meter(ts)
    rate = factor * capacity_rps
    runs = tuple(one_run(ts, model, rate, seconds, budget_ms, sends, window_s, connections) for sends in (False, True))
    return DeadlineComparison(model, entry.slo_ms, budget_ms, capacity_rps, factor, queue, batch, runs, others())


def report_table(result: DeadlineComparison) -> str:
    rows = [("offered (req/s)", [f"{r.offered_rps:.0f}" for r in result.runs]),
            ("sent", [str(r.traffic.sent) for r in result.runs]),
            ("tail of the 200s", [stats.tail_text(r.answered, 0) for r in result.runs]),
            (f"answered 200 within {result.budget_ms} ms", [f"{r.in_time_share:.1%}" for r in result.runs])]
    rows += [(name, [str(r.outcomes[name]) for r in result.runs]) for name in OUTCOMES]
    rows.append(("HandlerDeadlineExpired (/metrics)", [f"{r.expired_counter:.0f}" for r in result.runs]))
    return "\n".join(cli.table(("", *(r.label for r in result.runs)), [(name, *cells) for name, cells in rows],
                               ("---", *("---:" for _ in result.runs))))


def write_report(result: DeadlineComparison, out: Path, command: str) -> Path:
    """report.md, report.json and deadlines.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    environment = describe_environment()
    (out / "report.json").write_text(json.dumps({**result.to_json(), "environment": environment}, indent=2) + "\n",
                                     encoding="utf-8")
    with cli.figure(out / "deadlines.png", 1, 2, figsize=(12, 4.2), gridspec_kw={"wspace": 0.45}, dpi=100) as (bars, cdf):
        colours = {"200 in time": "#2ca02c", "200 late": "#98df8a", "503": "#ff7f0e", "504": "#1f77b4",
                   "other 5xx": "#d62728", "4xx": "#9467bd", "lost": "#000000"}
        labels = [r.label for r in result.runs]
        bottoms = [0.0] * len(result.runs)
        for name in OUTCOMES:
            shares = [r.outcomes[name] / max(1, r.traffic.sent) * 100 for r in result.runs]
            bars.bar(labels, shares, bottom=bottoms, color=colours[name], label=name)
            bottoms = [b + s for b, s in zip(bottoms, shares)]
        bars.set_ylabel("% of requests sent")
        bars.set_title(f"{result.model}: {result.runs[0].offered_rps:.0f} req/s offered "
                       f"({result.factor:g}x capacity)", fontsize=10)
        bars.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        for run in result.runs:
            if run.ok_latencies_ms:
                n = len(run.ok_latencies_ms)
                cdf.plot(run.ok_latencies_ms, [100.0 * (i + 1) / n for i in range(n)], label=f"{run.label} (n={n})")
        cdf.axvline(result.budget_ms, color="#555555", linestyle="--", label=f"budget {result.budget_ms} ms (2x SLO)")
        cdf.set_xlabel("latency of the 200s from intended send (ms)")
        cdf.set_ylabel("% of the 200s")
        cdf.set_title("answered requests", fontsize=10)
        cdf.legend(fontsize=8, loc="lower right")
    lines = [f"# Overload with and without deadlines: {result.model}", "",
             f"`{command}`", "",
             f"{environment['cpu']}, {environment['logical_cpus']} CPUs, torch {environment['torch']}, torchserve "
             f"{environment['torchserve']}, git {environment['git_commit']}", "",
             f"Capacity {result.capacity_rps:.1f} req/s (closed loop, {2 * result.batch_size} clients); offered "
             f"{result.factor:g}x that, open loop, {result.runs[0].seconds:.0f} s per run, job queue "
             f"{result.job_queue_size}, batch size {result.batch_size}. With deadlines every request carries "
             f"`{TIMEOUT_HEADER}: {result.budget_ms}` (2x the SLO of {result.slo_ms:g} ms) and its send time in "
             f"`{START_HEADER}`. Latency runs from each request's intended send time.", "",
             report_table(result), "",
             "![outcomes and latency](deadlines.png)", "",
             f"Other processes used {result.others_cpu_pct:.0f}% of a core meanwhile.", "",
             "Problems: " + ("; ".join(result.problems) if result.problems else "none"), ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return out


def run_on_own_server(store: Path, model: str, factor: float, seconds: float, job_queue_size: int,
                      extra_properties: Optional[Mapping[str, str]] = None) -> DeadlineComparison:
    props = {"job_queue_size": str(job_queue_size), **(extra_properties or {})}
    with TorchServe(store, load=(model,), extra_properties=props) as ts:
        return compare(ts, model, capacity(ts, model), factor, seconds)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("deadlines", __doc__.split("\n\n")[0])
    cli.add(p, "model", "model_store", "out", factor={"default": 2.0}, seconds={"default": 20.0},
            job_queue_size={"default": JOB_QUEUE_SIZE})
    args = p.parse_args(argv)
    model = cli.model_or_first(args.model)
    result = run_on_own_server(args.model_store, model, args.factor, args.seconds, args.job_queue_size)
    out = cli.report_folder(args.out, "deadlines", model)
    write_report(result, out, cli.command_line("deadlines", argv))
    return cli.verdict(result, report=out)
