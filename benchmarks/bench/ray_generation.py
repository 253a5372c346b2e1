"""A causal LM on Ray Serve against TorchServe's asynchronous worker mode, same host, same run, same
archive: output tokens/s at N closed-loop clients, time to first token and the gaps between chunks.

    python -m benchmarks ray-generation --model tinylm --clients 8 --replicas 1,2

Both engines serve one copy of the archive (the KV cache and continuous batching alone: speculation
and the prefix cache off, as in the generation verb's served rows), streamed /predictions requests
of `--new-tokens` tokens each. TorchServe: its async mode in each of `--ts-layouts` (workers x
threads). Ray: serving/ray/generation.py with `--replicas` replicas, the host's cores shared among
them (threads = cores / replicas each, or `--ray-threads`). Engines run one after another,
TorchServe first and again last, so a drift of the machine shows.

Writes benchmarks/reports/ray-generation-<model>-<time>/ (report.json, report.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

from benchmarks.bench.archive_settings import with_handler_settings
from benchmarks.bench.generation_load import PLAIN, probes, settings_for, throughput
from benchmarks.load import cli
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe
from serving.repo import shown
from serving.ts_config import ModelSettings

log = cli.progress("ray-generation")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


def _layouts(text: str) -> tuple[tuple[int, int], ...]:
    """"1x2,2x1" -> ((1, 2), (2, 1)): workers x threads."""
    try:
        return tuple((int(w), int(t)) for w, t in (v.split("x") for v in text.split(",") if v.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give workers x threads, comma-separated (1x2,2x1)") from None


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = cli.parser("ray-generation", __doc__.splitlines()[0])
    cli.add(p, "model_store", "out", model={"default": "tinylm"})
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2, help="requests per client, per engine")
    p.add_argument("--replicas", type=_ints, default=(1, 2), help="Ray replica counts, comma-separated")
    p.add_argument("--ray-threads", type=int, default=0, help="each replica's threads (0: the cores / replicas)")
    p.add_argument("--ts-layouts", type=_layouts, default=((1, 2), (2, 1)),
                   help="TorchServe's async-mode layouts, workers x threads, comma-separated")
    p.add_argument("--proxy", dest="haproxy", action="store_false",
                   help="Ray with Serve's Python proxy instead of its HAProxy ingress (the default)")
    return p.parse_args(argv)


def measure(server, args, label: str) -> dict:
    probes(server, args.model, 3)  # warm the path
    row = throughput(server, args.model, args.clients, args.new_tokens, args.rounds)
    log(f"  {label}: {row['tokens_per_s']} tokens/s, TTFT p50 {row['ttft_p50_ms']} ms")
    return {"engine": label, **row}


def torchserve(store: Path, args, layout: tuple[int, int]) -> dict:
    workers, threads = layout
    label = f"TorchServe async, {workers} worker(s) x {threads} thread(s)"
    log(label)
    settings = settings_for("async", args.clients, workers=workers, threads=threads)
    with TorchServe(store, models={args.model: settings}, load=(args.model,)) as server:
        return measure(server, args, label)


def ray(store: Path, args, replicas: int) -> dict:
    threads = args.ray_threads or max(1, (os.cpu_count() or 1) // replicas)
    label = f"Ray Serve{' (HAProxy)' if args.haproxy else ''}, {replicas} replica(s) x {threads} thread(s)"
    log(label)
    settings = ModelSettings(batch_size=1, max_batch_delay_ms=1, min_workers=replicas, max_workers=replicas,
                             threads=threads)
    with RayServe(store, models=(args.model,), settings={args.model: settings}, haproxy=args.haproxy) as server:
        row = measure(server, args, label)
        row["ready_s"] = round(server.started_s or 0.0, 1)
        return row


def markdown(report: dict) -> str:
    rows = report["rows"]
    base = max(r["tokens_per_s"] for r in rows if r["engine"].startswith("TorchServe"))
    lines = [f"# {report['model']} on Ray Serve against TorchServe's async mode", "",
             f"`{report['command']}` ({report['when']}; {report['cpus']} cores shared with other work: "
             "ratios from one run)", "",
             f"{report['clients']} closed-loop clients, {report['new_tokens']} new tokens per request (streamed "
             "/predictions, ignore_eos), speculation and prefix cache off. Ratio: against TorchServe's best row.", "",
             "| engine | requests | output tokens/s | ratio | TTFT p50 ms | TTFT p90 ms | chunk gap p90 ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['requests']} | {r['tokens_per_s']} | {r['tokens_per_s'] / base:.2f}x | "
                     f"{r['ttft_p50_ms']} | {r['ttft_p90_ms']} | {r['inter_chunk_p90_ms']} |")
    lines += ["", "Tails are p90: fewer than 1,000 requests per row."]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    args = parse(argv)
    started = cli.stamp()
    out = cli.report_folder(args.out, "ray-generation", args.model, when=started)
    rows = []
    with tempfile.TemporaryDirectory(prefix="raygen-") as tmp:
        store = Path(tmp)
        with_handler_settings(args.model_store / f"{args.model}.mar", store, args.model, {"causal_lm": {**PLAIN, "mode": "async"}})
        rows += [torchserve(store, args, layout) for layout in args.ts_layouts]
        rows += [ray(store, args, n) for n in args.replicas]
        again = torchserve(store, args, args.ts_layouts[0])
        rows.append(again | {"engine": again["engine"] + ", again (drift)"})
    report = {"model": args.model, "when": started, "cpus": os.cpu_count(), "clients": args.clients,
              "new_tokens": args.new_tokens, "rounds": args.rounds,
              "command": cli.command_line("ray-generation", argv),
              "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    log(f"report: {shown(out / 'report.md')}")
    print(markdown(report))
    return 0
