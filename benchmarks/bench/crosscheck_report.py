"""The cross-check's report: markdown tables and one plot (p99 against connections at low load,
p50/p99 by rate for both clients)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from benchmarks.load.stats import P99_MIN_SAMPLES

TAIL_BOUND = 2.0  # the tail over many connections at low load, as a multiple of one connection's


def _tail(*figures: dict) -> str:
    """The tail quantile figures share: the p99 where each holds >= 1,000 requests, else the p90."""
    return "p99" if all(f["requests"] >= P99_MIN_SAMPLES for f in figures) else "p90"


def _gap_pct(ours: dict, theirs: dict, key: str) -> Optional[float]:
    a, b = ours.get(key), theirs.get(key)
    return None if not a or not b else round(100.0 * (a - b) / b, 1)


def judge(found: dict) -> dict:
    """`found` with ours-against-wrk2 gaps (p50 and the tail) and the low-load tail verdict added."""
    for row in found["rates"]:
        w, o, r = row["wrk2"], row["ours_poisson"], row["ours_wrk2_schedule"]
        row["tail"] = _tail(w, o, r)
        row["p50_gap_pct"] = _gap_pct(o, w, "p50_ms")
        row["tail_gap_pct"] = _gap_pct(o, w, f"{row['tail']}_ms")
        row["replay_tail_gap_pct"] = _gap_pct(r, w, f"{row['tail']}_ms")
    for row in found["sweep"]:
        row["tail"] = _tail(row["wrk2"], row["ours_wrk2_schedule"])
        row["tail_gap_pct"] = _gap_pct(row["ours_wrk2_schedule"], row["wrk2"], f"{row['tail']}_ms")
    one = found["sweep"][0]["wrk2"]
    many = {row["connections"]: row["wrk2"] for row in found["sweep"] if row["connections"] >= 16}
    poisson = found["rates"][0]["ours_poisson"]
    key = f"{_tail(one, *many.values(), poisson)}_ms"
    found["low_load_tail"] = {
        "quantile": key[:3], "one_connection_ms": one[key], "bound_ms": round(TAIL_BOUND * one[key], 1),
        "rows": [{"connections": c, "wrk2_ms": f[key], "met": f[key] <= TAIL_BOUND * one[key]} for c, f in many.items()],
        "ours_poisson_ms": poisson[key], "ours_poisson_met": poisson[key] <= TAIL_BOUND * one[key]}
    return found


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cell(figures: dict) -> str:
    """p50 / p99 (n); under 1,000 requests the p99 is one of the few slowest: p90 instead."""
    n = figures["requests"]
    if n >= P99_MIN_SAMPLES:
        return f"{_ms(figures['p50_ms'])} / {_ms(figures['p99_ms'])} ({n})"
    return f"{_ms(figures['p50_ms'])} / p90 {_ms(figures['p90_ms'])} ({n})"


def _origin(found: dict) -> str:
    return "values set on the command line" if found["overridden"] else "the shipped values"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.0f}%"


def markdown(found: dict) -> str:
    tail = found["low_load_tail"]
    values = found["served_values"]
    lines = [
        f"# wrk2 against our generator: {found['model']} ({found['date']})", "",
        f"Command: `{found['command']}`", "",
        f"One TorchServe with {_origin(found)} (batch {values['batchSize']}, delay {values['maxBatchDelay']} ms, "
        f"{values['minWorkers']} worker(s)); rates are shares {found['fractions']} of {found['capacity_rps']:g} req/s. "
        f"Each point: {found['seconds']:g} s measured; wrk2 over {found['threads']} thread(s). Latency runs from each "
        "request's scheduled time in both clients; (n) is the number of requests a cell is over, and under 1,000 "
        "a cell gives the p90 in place of the p99.", "",
        f"## Same rate, same {found['connections']} connections", "",
        "wrk2 on its own schedule; ours on Poisson arrivals, then on wrk2's schedule replayed. Gaps: ours against wrk2.", "",
        "| rate req/s | wrk2 p50 / tail ms (n) | ours, Poisson | p50 / tail gap | ours, wrk2's schedule | tail gap | "
        "errors wrk2 / Poisson / replay |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in found["rates"]:
        w, o, r = row["wrk2"], row["ours_poisson"], row["ours_wrk2_schedule"]
        lines.append(f"| {row['rate_rps']:g} | {_cell(w)} | {_cell(o)} | {_pct(row['p50_gap_pct'])} / "
                     f"{_pct(row['tail_gap_pct'])} ({row['tail']}) | {_cell(r)} | {_pct(row['replay_tail_gap_pct'])} | "
                     f"{w['errors']} / {o['errors']} / {r['errors']} |")
    low = found["rates"][0]["rate_rps"]
    lines += [
        "", f"## At {low:g} req/s, by connections: both clients on wrk2's schedule", "",
        "wrk2 paces each connection on its own (every connections / rate seconds) and starts a thread's connections "
        "5 ms apart, so at a low rate over many connections requests come in bursts. Ours replays that schedule here.",
        "",
        "| connections | wrk2 p50 / tail ms (n) | ours on wrk2's schedule p50 / tail ms (n) | tail gap |",
        "|---|---|---|---|",
    ]
    for row in found["sweep"]:
        w, o = row["wrk2"], row["ours_wrk2_schedule"]
        lines.append(f"| {row['connections']} | {_cell(w)} | {_cell(o)} | {_pct(row['tail_gap_pct'])} ({row['tail']}) |")
    q = tail["quantile"]
    lines += ["", f"## Low-load tail target (wrk2, >= 16 connections, {q} <= 2x one connection's)", "",
              f"One connection: {q} {_ms(tail['one_connection_ms'])} ms, so the bound is {_ms(tail['bound_ms'])} ms"
              + ("" if q == "p99" else " (the p90: some of these points hold fewer than 1,000 requests)") + ".", ""]
    for row in tail["rows"]:
        lines.append(f"- wrk2, {row['connections']} connections: {q} {_ms(row['wrk2_ms'])} ms: "
                     f"{'met' if row['met'] else 'missed'}")
    lines.append(f"- ours, Poisson arrivals over {found['connections']} connections: {q} {_ms(tail['ours_poisson_ms'])} "
                 f"ms: {'met' if tail['ours_poisson_met'] else 'missed'}")
    lines += ["", "![p99 by connections and by rate](crosscheck.png)", ""]
    return "\n".join(lines)


def plot(path: Path, found: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    sweep = found["sweep"]
    xs = [row["connections"] for row in sweep]
    left.plot(xs, [row["wrk2"]["p99_ms"] for row in sweep], "o-", label="wrk2")
    left.plot(xs, [row["ours_wrk2_schedule"]["p99_ms"] for row in sweep], "s--", label="ours, wrk2's schedule")
    left.plot([found["connections"]], [found["rates"][0]["ours_poisson"]["p99_ms"]], "D", label="ours, Poisson")
    if found["low_load_tail"]["quantile"] == "p99":
        left.axhline(found["low_load_tail"]["bound_ms"], color="#d62728", linestyle=":", label="2x one connection's p99")
    left.set_xscale("log", base=2)
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_xlabel("connections")
    left.set_ylabel("p99 ms")
    left.set_title(f"{found['rates'][0]['rate_rps']:g} req/s: p99 by connections")
    left.legend(fontsize=8)
    left.grid(True, alpha=0.3)
    rates = [row["rate_rps"] for row in found["rates"]]
    for key, label, marker in (("wrk2", "wrk2", "o"), ("ours_poisson", "ours, Poisson", "s"),
                               ("ours_wrk2_schedule", "ours, wrk2's schedule", "^")):
        right.plot(rates, [row[key]["p99_ms"] for row in found["rates"]], marker + "-", label=f"{label} p99")
        right.plot(rates, [row[key]["p50_ms"] for row in found["rates"]], marker + ":", label=f"{label} p50")
    right.set_yscale("log")
    right.set_xlabel("rate (req/s)")
    right.set_ylabel("latency ms (log)")
    right.set_title(f"{found['connections']} connections: by rate")
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{found['model']}: wrk2 against our generator")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
