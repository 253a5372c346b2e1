"""Tune a generating model (causal_lm) for a time-to-first-token SLO, written into
config.properties like any model's values.

    python -m benchmarks tune --model tinylm [--slo-ms 100] [--no-write]

Each candidate is a real TorchServe under closed-loop streaming clients, each generating 64
tokens, at least --ttft-samples requests in all. A candidate whose TTFT p99 lies within the noise
band of the SLO, on either side, is measured twice more and the median decides (as the request
tuner's points are). The choice: the most tokens/s whose TTFT p99 is within the SLO (within 5%, the
fewer sequences). The written file is then read back by a restarted server and the choice measured
again by the same rule; that measurement is the record's figure, and one over the SLO fails the
tune. What the search varies follows the archive's mode:

- step mode (continuous batching, maxBatchDelay 1 ms): sequences per decoding step (batchSize), as
  many clients as that, on one worker with all the cores. TorchServe 0.12's continuous batching
  stalls a worker's running sequences while another worker of the model idles (Model.pollInferJob
  holds the queue lock through its wait), so the handler refuses a second worker.
- async mode: the frontend forwards each request (batchSize 1) and the worker's loop batches every
  sequence it holds, so the search is over the worker layout (one worker with all the cores, one
  worker of one thread, or one worker per core of one thread each) and the load (concurrent streams). The layout is
  written, its record holding the chosen load's tokens/s; the report lists every load.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Optional

from benchmarks.bench.generation_load import throughput
from benchmarks.load import cli, stats
from benchmarks.load.budget import Budget
from benchmarks.load.environment import cpu_model
from benchmarks.tune.config_writer import Provenance, Update, write_config
from benchmarks.tune.errors import TuneError
from benchmarks.tune.measure import NOISE_BAND, REMEASUREMENTS, median_by
from benchmarks.tune.search import CANDIDATE_MIN_S
from serving.launcher import TorchServe
from serving.repo import shown
from serving.ts_config import ModelSettings

BATCH_SIZES = (1, 2, 4, 8, 16, 32)  # step mode: sequences per step; async mode: concurrent streams
NEW_TOKENS = 64
TIE = 0.05
REQUEST_TIMEOUT_S = 60.0  # a 64-token request takes well under a second: longer means the server is stuck


@dataclass(frozen=True)
class Candidate:
    settings: ModelSettings
    tokens_per_s: float
    ttft_p99_ms: float
    requests: int
    ttft_p90_ms: Optional[float] = None  # what a report prints when the p99 is thin (stats.tail_text)
    clients: int = 0  # concurrent streams (0: one per sequence the step mode's batch holds)
    remeasured_p99_ms: tuple[float, ...] = ()  # every measurement's TTFT p99 when the noise band asked for more

    @property
    def streams(self) -> int:
        return self.clients or self.settings.batch_size * self.settings.min_workers

    @property
    def ttft(self) -> dict:
        """The TTFT figures as stats.tail_text reads them."""
        return ttft_of(self.to_json())

    def to_json(self) -> dict:
        s = self.settings
        return {"batch_size": s.batch_size, "workers": s.min_workers, "threads": s.threads, "clients": self.streams,
                "tokens_per_s": self.tokens_per_s, "ttft_p99_ms": self.ttft_p99_ms, "ttft_p90_ms": self.ttft_p90_ms,
                "requests": self.requests, "remeasured_ttft_p99_ms": list(self.remeasured_p99_ms)}


def ttft_of(candidate: dict) -> dict:
    return {"count": candidate["requests"], "p90_ms": candidate.get("ttft_p90_ms"), "p99_ms": candidate["ttft_p99_ms"]}


def measure(store: Path, model: str, settings: ModelSettings, samples: int, config: Optional[Path] = None,
            clients: int = 0) -> Candidate:
    clients = clients or settings.batch_size * settings.min_workers
    rounds = max(2, math.ceil(samples / clients))
    kwargs = {"base_config": config} if config else {"models": {model: settings}}
    with TorchServe(store, load=(model,), **kwargs) as server:
        throughput(server, model, clients, 8, 1, timeout_s=REQUEST_TIMEOUT_S)  # warm the path
        figures = throughput(server, model, clients, NEW_TOKENS, rounds, timeout_s=REQUEST_TIMEOUT_S)
    return Candidate(settings, figures["tokens_per_s"], figures["ttft_p99_ms"], figures["requests"],
                     figures["ttft_p90_ms"], clients)


def near_slo(candidate: Candidate, slo_ms: float) -> bool:
    return slo_ms / NOISE_BAND <= candidate.ttft_p99_ms <= slo_ms * NOISE_BAND


def median_candidate(measurements: list[Candidate]) -> Candidate:
    """The measurement with the median TTFT p99, whole (its tokens/s comes with it)."""
    return replace(median_by(measurements, lambda c: c.ttft_p99_ms),
                   remeasured_p99_ms=tuple(c.ttft_p99_ms for c in measurements))


def judged(measure_once: Callable[[], Candidate], slo_ms: float, progress: Callable[[str], None]) -> Candidate:
    """One measurement, or three when the first lies near the SLO on either side: measuring again
    only the near misses would bias the search up."""
    first = measure_once()
    if not near_slo(first, slo_ms):
        return first
    progress(f"  TTFT p99 {first.ttft_p99_ms:g} ms lies within {NOISE_BAND:g}x of the SLO ({slo_ms:g} ms), either "
             f"side: measuring {REMEASUREMENTS} more times, the median decides")
    return median_candidate([first, *(measure_once() for _ in range(REMEASUREMENTS))])


def choose(results: list[Candidate], slo_ms: float) -> Optional[Candidate]:
    passing = [r for r in results if r.ttft_p99_ms <= slo_ms]
    if not passing:
        return None
    best = max(r.tokens_per_s for r in passing)
    near = [r for r in passing if r.tokens_per_s >= best * (1 - TIE)]
    return min(near, key=lambda r: r.streams)


def search_space(asynchronous: bool, cores: int) -> list[tuple[ModelSettings, int]]:
    """(server settings, concurrent streams) per candidate."""
    if not asynchronous:
        return [(ModelSettings(batch_size=b, max_batch_delay_ms=1, min_workers=1, max_workers=1, threads=cores), 0)
                for b in BATCH_SIZES]
    # One worker on every core; one worker of one thread, leaving the other cores to the frontend and
    # the sends; one worker of one thread per core.
    layouts = [(1, cores)] + ([(1, 1), (cores, 1)] if cores > 1 else [])
    return [(ModelSettings(batch_size=1, max_batch_delay_ms=1, min_workers=w, max_workers=w, threads=t), n)
            for w, t in layouts for n in BATCH_SIZES]


def is_async(archive: Path) -> bool:
    """Whether the archive's model-config.yaml runs TorchServe's asynchronous worker mode."""
    import zipfile

    import yaml

    with zipfile.ZipFile(archive) as mar:
        config = yaml.safe_load(mar.read("model-config.yaml")) if "model-config.yaml" in mar.namelist() else None
    return bool((config or {}).get("asyncCommunication"))


def tune(model: str, slo_ms: float, store: Path, config: Path, out: Path, cores: int, write: bool, samples: int,
         command: str, progress: Callable[[str], None], budget_s: Optional[float] = None) -> int:
    """`budget_s`: candidates that would not end within it are not measured (the report names them);
    the best of those measured is written and verified."""
    budget = Budget(budget_s)
    folder = cli.report_folder(out, "tune", model)
    folder.mkdir(parents=True, exist_ok=True)
    asynchronous = is_async(store / f"{model}.mar")
    space = search_space(asynchronous, cores)
    progress(f"TTFT p99 <= {slo_ms:g} ms; {len(space)} candidates ("
             + (f"async mode: worker layouts x {list(BATCH_SIZES)} concurrent streams" if asynchronous else
                f"step mode: batchSize {list(BATCH_SIZES)}, one worker x {cores} threads")
             + f"); closed-loop streaming clients, {NEW_TOKENS} tokens each")
    results, took = [], []
    for i, (settings, clients) in enumerate(space, start=1):
        need = max(took, default=CANDIDATE_MIN_S)
        if not budget.allows(f"batchSize {settings.batch_size}, {settings.min_workers} x {settings.threads}, "
                             f"{clients} streams", need):
            progress(f"time budget spent: {len(space) - i + 1} candidate(s) not measured")
            break
        began = time.monotonic()
        result = judged(partial(measure, store, model, settings, samples, clients=clients), slo_ms, progress)
        took.append(time.monotonic() - began)
        results.append(result)
        progress(f"[{i}/{len(space)}] batchSize {settings.batch_size}, {settings.min_workers} x {settings.threads}, "
                 f"{result.streams} streams: {result.tokens_per_s:.0f} tokens/s, TTFT {stats.tail_text(result.ttft, 0)}")
    chosen = choose(results, slo_ms)
    report = {"model": model, "mode": "async" if asynchronous else "step", "slo_ms": slo_ms,
              "command": portable(command), "candidates": [r.to_json() for r in results],
              "chosen": chosen.to_json() if chosen else None, "written": False, "verified": None,
              "budget": budget.to_json()}
    verified = True
    if chosen is None:
        progress("no candidate meets the SLO: config.properties left alone")
    elif write:
        def record(measured: Candidate, verdict: str) -> Provenance:
            return Provenance(model, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), slo_ms, chosen.settings,
                              chosen.settings.threads, measured.tokens_per_s, measured.ttft_p99_ms, verdict, None,
                              shown(folder), cpu_model(), unit="tokens/s", latency="TTFT p99")

        write_config(config, [Update(model, chosen.settings)], [record(chosen, "search only")])
        report["written"] = True
        again = judged(lambda: measure(store, model, chosen.settings, samples, config=config, clients=chosen.clients),
                       slo_ms, progress)
        verified = again.ttft_p99_ms <= slo_ms
        verdict = ("verified from the written file" if verified else
                   f"verification FAILED: TTFT p99 {again.ttft_p99_ms:g} ms against the SLO")
        write_config(config, [Update(model, chosen.settings)], [record(again, verdict)], check_plan=False)
        report["verified"] = again.to_json()
        report["verdict"] = verdict
        progress(f"written to {shown(config)}; restarted from it: {again.tokens_per_s:.0f} tokens/s, TTFT "
                 f"{stats.tail_text(again.ttft, 0)}: {verdict}")
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "report.md").write_text(markdown(report))
    plot(report, folder / "candidates.png")
    progress(f"report: {shown(folder / 'report.md')}")
    if chosen is None:
        raise TuneError(f"{model}: no candidate has TTFT p99 <= {slo_ms:g} ms (see {shown(folder)})")
    return 0 if verified else 1


def portable(command: str) -> str:
    """The command with no path of this machine in it (a committed report is read elsewhere):
    repository paths relative, others as <outside the repository>/<name>."""
    import shlex

    words = []
    for word in shlex.split(command):
        if word.startswith("/"):
            where = shown(word)
            word = where if not where.startswith("/") else f"<outside the repository>/{Path(word).name}"
        words.append(word)
    return shlex.join(words)


def markdown(report: dict) -> str:
    rows = [(c["batch_size"], f"{c['workers']} x {c['threads']}", c.get("clients", ""), c["tokens_per_s"],
             f"{stats.tail_cell(ttft_of(c), 0)}{remeasured(c)}",
             "**chosen**" if report["chosen"] and c == report["chosen"] else "") for c in report["candidates"]]
    verified = report.get("verified")
    return "\n".join([
        f"# Tune {report['model']}: {report.get('mode', 'step')} mode, for TTFT p99 <= {report['slo_ms']:g} ms", "",
        f"Command: `{report['command']}`", "",
        *cli.table(("batchSize", "workers x threads", "streams", "tokens/s", "TTFT p99 ms", ""), rows), "",
        f"The choice compares each candidate's TTFT p99; a p99 over fewer than {stats.P99_MIN_SAMPLES:,} requests "
        "is shown as the p90 and the count.", "",
        f"Written to config.properties: {report['written']}."
        + (f" Restarted from the written file: {verified['tokens_per_s']} tokens/s, TTFT "
           f"{stats.tail_text(ttft_of(verified), 0)}{remeasured(verified)}: "
           f"{report.get('verdict', 'measured')}." if verified else ""), "",
        f"A TTFT p99 within {NOISE_BAND:g}x of the SLO, either side, is measured {REMEASUREMENTS} more times and the "
        "median decides; every measurement's p99 is in brackets.", "", *budget_lines(report.get("budget")),
        "![candidates](candidates.png)", ""])


def budget_lines(budget: Optional[dict]) -> list[str]:
    if not budget or not budget.get("left_out"):
        return []
    return [f"The time budget ({budget['budget_s'] / 60:g} min) ended the search: not measured: "
            + "; ".join(budget["left_out"]) + ".", ""]


def remeasured(candidate: dict) -> str:
    runs = candidate.get("remeasured_ttft_p99_ms") or []
    return f" ({' / '.join(f'{p:g}' for p in runs)})" if runs else ""


def plot(report: dict, path: Path) -> None:
    with cli.figure(path, figsize=(6, 4)) as ax:
        asynchronous = report.get("mode") == "async"
        for layout in sorted({(c["workers"], c["threads"]) for c in report["candidates"]}):
            rows = [c for c in report["candidates"] if (c["workers"], c["threads"]) == layout]
            ax.plot([c["ttft_p99_ms"] for c in rows], [c["tokens_per_s"] for c in rows], "o-",
                    label=f"{layout[0]} worker(s) x {layout[1]} thread(s)")
            for c in rows:
                ax.annotate(f"{c.get('clients')} streams" if asynchronous else f"b{c['batch_size']}",
                            (c["ttft_p99_ms"], c["tokens_per_s"]), fontsize=8)
        ax.axvline(report["slo_ms"], color="red", linestyle="--", label="SLO")
        ax.set_xlabel("TTFT p99, ms")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{report['model']}: candidates")
        ax.legend()
