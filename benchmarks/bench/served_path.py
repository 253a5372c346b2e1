"""Where a served request's time goes: the no-op ceiling and the per-request breakdown.

- Ceiling: the same server (batch delay, workers, the model's own requests) with a handler that
  does nothing (benchmarks/bench/noop/), at batch sizes 1, 8 and ours: the most this machine's
  frontend + worker path can carry, and its latency at one client.
- Breakdown: at one closed-loop client every batch holds one request, so the server's counters
  split a request's mean time exactly: outside TorchServe's timer (client, loopback, HTTP) ->
  frontend queue + batching wait -> the worker's round trip outside our handler (socket,
  TorchServe's message decode/encode, its worker thread) -> our decode, inference, post-processing
  (response encoding included).
- Combined limit: model and served path share the cores, so per request their costs add up:
  1 / (1 / in-process limit + 1 / ceiling at our batch size) is what the machine can serve at best.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Optional

from benchmarks.load import cli, stats
from benchmarks.load.runner import LoadPlan, ServerRun, peak, run_server
from serving.launcher import TorchServe
from serving.ts_config import ModelSettings

Progress = Callable[[str], None]
CEILING_BATCH_SIZES = (1, 8)


def ceiling_batch_sizes(ours: int, only_ours: bool = False) -> tuple:
    return (ours,) if only_ours else tuple(sorted({*CEILING_BATCH_SIZES, ours}))


def measure_ceiling(model: str, settings: ModelSettings, plan: LoadPlan, base_config: Path,
                    extra_properties: Mapping[str, str], tmp: Path, progress: Progress,
                    only_ours: bool = False) -> dict[int, ServerRun]:
    """Closed-loop sweeps of the no-op archive under ours' frontend values, one server per batch size
    (`only_ours`: ours' batch size alone, which the combined limit needs: the smoke run's form)."""
    from benchmarks.bench.noop.archive import build_noop

    store = tmp / "noop-store"
    build_noop(model, store)
    sweep = replace(plan, rates=(), rate_fractions=())
    runs = {}
    for size in ceiling_batch_sizes(settings.batch_size, only_ours):
        values = replace(settings, batch_size=size)
        progress(f"[ceiling] no-op handler, batch size {size}, delay {values.max_batch_delay_ms} ms, "
                 f"{values.max_workers} worker(s)")
        with TorchServe(store, base_config=base_config, models={model: values}, load=(model,),
                        extra_properties=extra_properties) as ts:
            runs[size] = run_server(f"ceiling b{size}", ts, model, sweep, progress)
    return runs


def one_client(run: ServerRun) -> Optional[dict]:
    return next((p.figures for p in run.points if p.figures["mode"] == "closed" and p.figures["level"] == 1), None)


def breakdown(figures: Optional[dict]) -> Optional[dict[str, float]]:
    """Mean ms per request at one client, by where it was spent (see the module docstring)."""
    if not figures or not figures["latency_ms"]:
        return None
    server = figures["server"]
    client = figures["latency_ms"]["mean_ms"]
    frontend, queue = server["frontend_ms_per_request"], server["queue_ms_per_request"]
    if frontend is None or queue is None:
        return None
    stages = server["stage_ms_per_batch"]  # one request per batch at one client
    handler = sum(stages.values())
    return {
        "client_mean_ms": client,
        "client_p50_ms": figures["latency_ms"]["p50_ms"],
        "outside_torchserve_ms": client - frontend,
        "queue_and_batching_wait_ms": queue,
        "worker_round_trip_ms": frontend - queue - handler,
        "decode_ms": stages.get("preprocess", 0.0),
        "inference_ms": stages.get("inference", 0.0),
        "postprocess_ms": stages.get("postprocess", 0.0),
    }


def summarize(ours: ServerRun, ceiling: Mapping[int, ServerRun], inprocess_items_per_s: float,
              ours_batch_size: int, slo_rps: Optional[float]) -> dict:
    rows = {}
    for size, run in ceiling.items():
        top, single = peak(run.points), one_client(run)
        latency = (single or {}).get("latency_ms") or {}
        rows[str(size)] = {
            "peak_rps": top["throughput_rps"] if top else None,
            "peak_point": f"c={top['level']:g}" if top else None,
            "one_client_p50_ms": latency.get("p50_ms"),
            "one_client_p99_ms": latency.get("p99_ms"),
            "one_client_p90_ms": latency.get("p90_ms"),
            "one_client_samples": latency.get("count"),
            "breakdown": breakdown(single),
        }
    at_ours = rows.get(str(ours_batch_size), {}).get("peak_rps")
    combined = 1.0 / (1.0 / inprocess_items_per_s + 1.0 / at_ours) if at_ours and inprocess_items_per_s else None
    return {
        "ceiling": rows,
        "combined_limit_rps": combined,
        "slo_share_of_combined": slo_rps / combined if slo_rps and combined else None,
        "ours_one_client": breakdown(one_client(ours)),
    }


BREAKDOWN_ROWS = (
    ("outside_torchserve_ms", "client, loopback and HTTP (outside TorchServe's timer)"),
    ("queue_and_batching_wait_ms", "frontend queue + batching wait (maxBatchDelay for a batch that does not fill)"),
    ("worker_round_trip_ms", "frontend <-> worker: socket, TorchServe's message decode/encode, its worker thread"),
    ("decode_ms", "our decode and validation"),
    ("inference_ms", "inference"),
    ("postprocess_ms", "post-processing and response encoding"),
    ("client_mean_ms", "end to end, mean"),
    ("client_p50_ms", "end to end, p50"),
)


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(section: dict, ours_batch_size: int, inprocess_items_per_s: float) -> list[str]:
    rows = section["ceiling"]
    lines = ["## Where the time goes", "",
             "No-op ceiling: the same server and requests with a handler that does nothing "
             "(benchmarks/bench/noop/): what the frontend + worker path alone carries on this machine.", "",
             *cli.table(("no-op handler", "peak req/s", "at", "p50 one client (ms)", "p99 one client (ms)"),
                        [_ceiling_row(size, row, ours_batch_size) for size, row in rows.items()])]
    combined = section["combined_limit_rps"]
    lines += ["", f"In-process limit {inprocess_items_per_s:.1f} items/s; with the served path's own cost at our "
              f"batch size the machine can serve at most {_ms(combined)} req/s (1 / (1/in-process + 1/ceiling)); "
              f"ours at the p99 target reaches "
              + (f"{section['slo_share_of_combined']:.0%} of that." if section["slo_share_of_combined"] else "n/a."), ""]
    ours = section["ours_one_client"]
    noop = rows.get(str(ours_batch_size), {}).get("breakdown")
    lines += ["Per request at one closed-loop client (mean ms; each batch holds one request, so the server's "
              "counters split the time exactly):", "",
              *cli.table(("stage", "ours", "no-op handler"),
                         [(label, _ms((ours or {}).get(key)), _ms((noop or {}).get(key))) for key, label in BREAKDOWN_ROWS])]
    return lines + [""]


def _ceiling_row(size: str, row: dict, ours_batch_size: int) -> tuple:
    label = f"batch {size}" + (" (ours)" if int(size) == ours_batch_size else "")
    if not row["peak_rps"]:
        return (label, "-", "-", "-", "-")
    one = {"count": row.get("one_client_samples"), "p90_ms": row.get("one_client_p90_ms"),
           "p99_ms": row["one_client_p99_ms"]}
    return (label, f"{row['peak_rps']:.1f}", row["peak_point"], _ms(row["one_client_p50_ms"]), stats.tail_cell(one, 2))



def sentence(section: dict, ours_batch_size: int, inprocess_items_per_s: float) -> str:
    rows = section["ceiling"]
    peaks = ", ".join(f"{row['peak_rps']:.0f} req/s at batch {size}" for size, row in rows.items() if row["peak_rps"])
    text = f"A no-op handler on the same server peaks at {peaks}"
    if section["combined_limit_rps"]:
        text += (f"; with the in-process limit ({inprocess_items_per_s:.1f} items/s) that leaves at most "
                 f"{section['combined_limit_rps']:.1f} req/s at batch {ours_batch_size}")
        if section["slo_share_of_combined"]:
            text += f", of which ours serves {section['slo_share_of_combined']:.0%} at the p99 target"
    return text + "."
