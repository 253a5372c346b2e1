"""A p99 a report prints rests on at least stats.P99_MIN_SAMPLES samples; below that the report
prints the p90 and the sample count instead. The rule itself, then report lines that follow it."""

from __future__ import annotations

import json

import pytest

from benchmarks.load import stats
from serving.repo import REPORTS

pytestmark = pytest.mark.unit

THIN = {"count": 640, "p50_ms": 8.0, "p90_ms": 12.34, "p99_ms": 40.0, "p999_ms": 41.0, "max_ms": 41.5}


def test_a_summary_of_500_samples_prints_its_p90_and_n():
    thin = stats.summarize(i / 1000 for i in range(1, 501))
    assert thin.tail() == f"p90 {thin.p90_ms:.1f} ms (n=500)"
    enough = stats.summarize(i / 1000 for i in range(1, 1001))
    assert enough.tail() == f"p99 {enough.p99_ms:.1f} ms" and stats.P99_MIN_SAMPLES == 1000


def test_json_figures_table_cells_and_ratios_follow_the_same_rule():
    assert stats.tail_text(THIN) == "p90 12.3 ms (n=640)"
    assert stats.tail_cell(THIN, 0) == "p90 12 (n=640)"
    assert stats.tail_cell(dict(THIN, count=1000), 0) == "40"
    assert stats.tail_text({"count": None, "p90_ms": None, "p99_ms": 40.0}) == "p99 40.0 ms (n not recorded)"
    assert stats.tail_text(None) == "-"
    busy, idle = dict(THIN, count=200, p90_ms=20.0), dict(THIN, count=200, p90_ms=10.0)
    assert stats.tail_ratio(busy, idle) == "p90 (n=200 / 200): 2.00x"
    assert stats.tail_ratio(dict(busy, count=1000), dict(idle, count=5000, p99_ms=20.0)) == "p99: 2.00x"
    # A p99.9 needs ten times as many.
    assert stats.supports(99.0, 1000) and not stats.supports(99.9, 2000) and stats.supports(99.9, 10000)


def test_the_bench_report_prints_thin_points_and_a_thin_peak_as_p90():
    from benchmarks.bench import report

    committed = json.loads((REPORTS / "efficientnet_lite0-20261121-083716" / "report.json").read_text())
    text = report.markdown(committed)
    thin_points = 0
    for server, run in committed["results"].items():
        section = text.split(f"## Points: {server}\n")[1].split("\n## ")[0]
        rows = [line for line in section.splitlines() if line.startswith(("| closed |", "| open |"))]
        assert len(rows) == len(run["points"])
        for row, f in zip(rows, run["points"]):
            cells = [c.strip() for c in row.strip("|").split("|")]
            latency = f["latency_ms"]
            if latency["count"] < 1000:
                thin_points += 1
                assert cells[6] == f"p90 {latency['p90_ms']:.0f} (n={latency['count']})"
            else:
                assert cells[6].split(" ")[0] == f"{latency['p99_ms']:.0f}"
            assert cells[7] == ("-" if latency["count"] < 10000 else f"{latency['p999_ms']:.0f}")
    assert thin_points >= 5
    ours = {"peak_rps": 72.0, "peak_p99_ms": 40.0, "peak_p90_ms": 12.0, "peak_samples": 640, "peak_point": "closed 1",
            "slo_rps": 0.0, "slo_p99_ms": None, "slo_point": None}
    summary = {"slo_ms": 100.0, "ours": ours, "stock": None, "efficiency_at_peak": 0.5, "variants": {}}
    peak = report.sentences(summary)[1]
    assert "p90 12 ms (n=640)" in peak and "p99" not in peak


def test_the_tune_report_prints_thin_points_as_p90(capsys):
    from benchmarks.tune import report

    thin = {"p99_ms": 40.0, "p90_ms": 12.34, "samples": 640}
    row = {"label": "tuned (search)", "workers": 2, "threads": 1, "batch_size": 4, "max_batch_delay_ms": 2,
           "throughput_rps": 100.0, **thin}
    best = {"rate_rps": 100.0, "achieved_rps": 100.0, "errors": 0, "mean_batch": 2.0, **thin}
    result = {"key": "w2-t1-b4-d2", "candidate": {"workers": 2, "threads": 1, "batch_size": 4, "max_batch_delay_ms": 2},
              "best": best, "points": [best], "throughput_rps": 100.0, "start_rps": 90.0, "seconds": 10.0,
              "phase": "search"}
    content = {"model": "m", "slo_ms": 50.0, "started": "x", "verdict": "v", "before_after": [row],
               "search": [result], "space_size": 4, "command": "python -m benchmarks.tune", "environment": {},
               "verification": {"config": "c", "described": {}, "worker_threads": [1], "summary": "s",
                                "points": [{**best, "offered_rps": 100.0}]}}
    text = report.markdown(content)
    assert "| 100.0 | p90 12.3 (n=640) |" in text  # before / after, and the candidate table
    assert "100.0 served, p90 12.3 ms (n=640)" in text  # verification
    assert "40.0" not in text
    report.print_summary(content, folder=__import__("pathlib").Path("out"))
    assert "p90 12.3 (n=640)" in capsys.readouterr().out


def test_generation_ttft_figures_print_p90_and_n():
    from benchmarks.bench import generation_report as generation

    committed = json.loads((REPORTS / "generation-tinylm-20261123-134730" / "report.json").read_text())
    text = generation.markdown(committed)
    idle, busy = committed["served"]["ttft_idle"], committed["served"]["ttft_busy"]
    assert f"| ttft_idle | {idle['count']} | {idle['p50_ms']} | {idle['p90_ms']} | " \
           f"p90 {idle['p90_ms']:.2f} (n={idle['count']}) |" in text
    assert f"Busy over idle, p90 (n={busy['count']} / {idle['count']}): " \
           f"**{busy['p90_ms'] / idle['p90_ms']:.2f}x**" in text
    prefix = committed["further"]["prefix"]
    assert f"p90 {prefix['hit']['p90_ms']:.2f} (n={prefix['hit']['count']})" in text
    assert f"{prefix['miss_over_hit_p99']}x at p99" not in text


def test_the_generation_tuner_prints_its_thin_ttft_as_p90():
    from benchmarks.tune import generation

    candidate = {"batch_size": 8, "workers": 1, "threads": 2, "tokens_per_s": 900.0, "ttft_p99_ms": 80.0,
                 "ttft_p90_ms": 30.0, "requests": 64}
    text = generation.markdown({"model": "tinylm", "slo_ms": 100.0, "command": "c", "candidates": [candidate],
                                "chosen": candidate, "written": True, "verified": candidate})
    assert "| 900.0 | p90 30 (n=64) |" in text and "TTFT p90 30 ms (n=64)" in text and "80" not in text


def test_a_mix_reports_each_models_thin_p99_as_p90():
    from benchmarks.tune.mix import report

    best = {"models": {"a": {"achieved_rps": 50.0, "latency_ms": THIN}}}
    rows = report._per_model_rows({"options": {"mix": {"slo_ms": {"a": 50.0}}}, "verified": {"best": best}}, "verified")
    assert rows == ["| a | 50.0 | p90 12.3 (n=640) | 50 |"]


def test_a_compared_run_states_its_low_load_tail_beside_ours():
    from benchmarks.bench import report

    def run(slo_rps, low_rps, p99, samples):
        return {"peak_rps": None, "slo_rps": slo_rps, "low_load_rps": low_rps, "low_load_p99_ms": p99,
                "low_load_p90_ms": p99 / 2, "low_load_samples": samples}

    summary = {"slo_ms": 100.0, "ours": run(200.0, 50.0, 12.0, 2000), "stock": None, "efficiency_at_slo": 0.5,
               "inprocess_items_per_s": 400.0, "variants": {"variant int8": run(250.0, 62.5, 9.0, 800)}}
    compared = report.sentences(summary)[2]
    assert compared.startswith("Same settings and load, variant int8: 250.0 req/s at p99 <= 100 ms (ours 0.80x")
    assert compared.endswith("at low load p90 4.5 ms (n=800) at 62.5 req/s (ours p99 12.0 ms at 50.0 req/s).")
