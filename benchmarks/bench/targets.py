"""The served path's targets, each checked on figures of one run (no figure from another day).

- p50 at one closed-loop client <= the handler's in-process batch-1 time + P50_ALLOWANCE_MS: what
  the frontend, the worker round trip and the batching wait may add to a request on an idle server;
- at LOW_LOAD of the capacity (open loop), p99 <= TAIL_RATIO x the one-client p99: no tail floor at
  low load (idle wake-ups, timers, the batching wait); the p90s, named so, where either p99 would
  rest on fewer than stats.P99_MIN_SAMPLES requests;
- capacity within the p99 target >= INPROCESS_SHARE of the in-process limit, or, where the served
  path's own cost makes that impossible, >= COMBINED_SHARE of the limit the no-op ceiling leaves
  (1 / (1/in-process + 1/ceiling)): the bound is the smaller of the two.
"""

from __future__ import annotations

from typing import Optional

from benchmarks.bench.served_path import one_client
from benchmarks.load import cli, stats
from benchmarks.load.runner import ServerRun

P50_ALLOWANCE_MS = 4.0
LOW_LOAD = (0.10, 0.30)
TAIL_RATIO = 2.0
INPROCESS_SHARE = 0.70
COMBINED_SHARE = 0.90


def _row(target: str, measured: Optional[float], bound: Optional[float], unit: str, at_least: bool = False) -> dict:
    met = None if measured is None or bound is None else (measured >= bound if at_least else measured <= bound)
    return {"target": target, "measured": measured, "bound": bound, "unit": unit, "at_least": at_least, "met": met}


def check(ours: ServerRun, summary: dict, inprocess: dict, path: Optional[dict]) -> list[dict]:
    single = one_client(ours)
    latency = (single or {}).get("latency_ms") or {}
    batch1 = inprocess.get("batch1_ms")
    rows = [_row(f"p50 at one client <= in-process batch 1 ({batch1:.2f} ms) + {P50_ALLOWANCE_MS:g} ms"
                 if batch1 else "p50 at one client (no in-process batch-1 time)",
                 latency.get("p50_ms"), batch1 + P50_ALLOWANCE_MS if batch1 else None, "ms")]
    capacity = summary["ours"]["slo_rps"]
    low = [f for f in (p.figures for p in ours.points)
           if f["mode"] == "open" and f["latency_ms"] and capacity
           and LOW_LOAD[0] <= f["throughput_rps"] / capacity <= LOW_LOAD[1]]
    for f in low:
        counts = (f["latency_ms"].get("count"), latency.get("count"))
        tail = stats.tail_name(*counts)
        one = latency.get(f"{tail}_ms")
        thin = "" if tail == "p99" else f" (n={counts[0]} / {counts[1]}: too few for a p99)"
        share = f"{f['throughput_rps'] / capacity:.0%}"
        rows.append(_row(f"{tail} at {f['throughput_rps']:.0f} req/s ({share} of capacity) "
                         f"<= {TAIL_RATIO:g} x one-client {tail}{thin}", f["latency_ms"][f"{tail}_ms"],
                         TAIL_RATIO * one if one else None, "ms"))
    if not low:
        rows.append(_row(f"p99 at {LOW_LOAD[0]:.0%}-{LOW_LOAD[1]:.0%} of capacity (no point there)", None, None, "ms"))
    limit = inprocess["items_per_s"]
    combined = (path or {}).get("combined_limit_rps")
    bound = min(INPROCESS_SHARE * limit, COMBINED_SHARE * combined) if combined else INPROCESS_SHARE * limit
    rows.append(_row(f"capacity at p99 <= {summary['slo_ms']:g} ms >= min({INPROCESS_SHARE:.0%} of in-process "
                     f"{limit:.0f}, {COMBINED_SHARE:.0%} of combined limit "
                     + (f"{combined:.0f})" if combined else "n/a)"), capacity or None, bound, "req/s", at_least=True))
    return rows


def markdown(rows: list[dict]) -> list[str]:
    return ["## Targets (this run)", "", *cli.table(("target", "measured", "bound", ""), [(
        r["target"], "-" if r["measured"] is None else f"{r['measured']:.1f} {r['unit']}",
        "-" if r["bound"] is None else f"{'>=' if r['at_least'] else '<='} {r['bound']:.1f} {r['unit']}",
        {True: "met", False: "**missed**", None: "n/a"}[r["met"]]) for r in rows]), ""]
