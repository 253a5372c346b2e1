"""The wrk2 cross-check's parts: arrival schedules, wrk2's output read right, options refused."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from benchmarks.bench import crosscheck
from benchmarks.bench.crosscheck_report import judge, markdown
from benchmarks.load import wrk2
from benchmarks.load.arrivals import per_connection_schedule, poisson_schedule
from serving.errors import BenchmarkError

pytestmark = pytest.mark.unit

WRK2_OUTPUT = Path(__file__).with_name("wrk2_output.txt")


def test_poisson_schedule_keeps_its_rate() -> None:
    offsets = list(itertools.islice(poisson_schedule(200.0, seed=1), 20_000))
    assert offsets == sorted(offsets)
    assert 20_000 / offsets[-1] == pytest.approx(200.0, rel=0.03)


def test_per_connection_schedule_bursts_at_low_rate() -> None:
    # wrk2 -t2 -c32 -R60: each connection every 533 ms, a thread's 16 connections 5 ms apart.
    offsets = list(itertools.islice(per_connection_schedule(60.0, 32, 2), 64))
    first, second = offsets[:32], offsets[32:]
    assert max(first) == pytest.approx(0.075)  # the whole first round within 80 ms
    assert min(second) == pytest.approx(32 / 60.0)
    assert len(offsets) / (offsets[-1] + 0.005) < 200  # ... yet 60 req/s on average over the rounds


def test_one_connection_is_evenly_paced() -> None:
    offsets = list(itertools.islice(per_connection_schedule(50.0, 1, 1), 5))
    assert offsets == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08])


def test_wrk2_output_is_read_from_its_corrected_histogram() -> None:
    # A real run's output: wrk2 -t2 -c32 -R62 against minilm.
    run = wrk2.parse(WRK2_OUTPUT.read_text(), 62.0, 32, 2, 30.0)
    assert (run.p50_ms, run.p90_ms, run.p99_ms) == pytest.approx((37.22, 57.22, 77.76))
    assert run.requests == 1920
    assert run.throughput_rps == pytest.approx(62.03)
    assert run.errors == 0


def test_wrk2_errors_are_its_non_2xx_answers_and_socket_errors() -> None:
    text = WRK2_OUTPUT.read_text().replace(
        "Requests/sec:", "  Socket errors: connect 0, read 1, write 0, timeout 2\n  Non-2xx or 3xx responses: 4\nRequests/sec:")
    assert wrk2.parse(text, 62.0, 32, 2, 30.0).errors == 7


def test_seconds_and_minutes_are_read_as_milliseconds() -> None:
    text = WRK2_OUTPUT.read_text().replace(" 99.000%   77.76ms", " 99.000%    1.50s")
    assert wrk2.parse(text, 62.0, 32, 2, 30.0).p99_ms == pytest.approx(1500.0)


def test_wrk2_output_without_latency_is_refused() -> None:
    text = WRK2_OUTPUT.read_text()
    cut = text[: text.index("Latency Distribution")]
    with pytest.raises(BenchmarkError, match="no latency distribution"):
        wrk2.parse(cut, 60.0, 32, 2, 30.0)


@pytest.mark.parametrize("argv, message", [
    (["--connections", "8"], "--connections must be >= 16"),
    (["--fractions", "0.25,x"], "not a comma-separated list"),
    (["--fractions", "0"], "each share must be in"),
    (["--capacity", "0"], "--capacity must be > 0"),
])
def test_options_out_of_range_are_refused(argv, message, tmp_path) -> None:
    fake = tmp_path / "wrk"
    fake.write_text("")
    args = crosscheck.parser().parse_args(["--model", "minilm", "--capacity", "100", "--wrk", str(fake), *argv])
    with pytest.raises(BenchmarkError, match=message):
        crosscheck.config_from(args, [])


def _figures(p50, p90, p99, n) -> dict:
    return {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "requests": n, "errors": 0}


def _found(low_rate_ours: dict, many: dict) -> dict:
    row = {"rate_rps": 50.0, "wrk2": many, "ours_poisson": low_rate_ours, "ours_wrk2_schedule": _figures(7, 9, 31, 1500)}
    return {"model": "m", "date": "d", "command": "c", "overridden": False,
            "served_values": {"batchSize": 6, "maxBatchDelay": 1, "minWorkers": 1}, "fractions": [0.25],
            "capacity_rps": 200, "seconds": 30, "threads": 2, "connections": 32, "rates": [row],
            "sweep": [{"connections": 1, "wrk2": _figures(6, 7, 9, 1500), "ours_wrk2_schedule": _figures(6, 7, 10, 1500)},
                      {"connections": 32, "wrk2": many, "ours_wrk2_schedule": row["ours_wrk2_schedule"]}]}


def test_gaps_and_the_tail_target_compare_p99s_over_enough_requests() -> None:
    found = judge(_found(_figures(7, 8, 15, 1500), _figures(7, 9, 30, 1500)))
    row = found["rates"][0]
    assert (row["tail"], row["tail_gap_pct"], row["replay_tail_gap_pct"]) == ("p99", -50.0, pytest.approx(3.3))
    tail = found["low_load_tail"]
    assert (tail["quantile"], tail["bound_ms"]) == ("p99", 18.0)
    assert tail["rows"] == [{"connections": 32, "wrk2_ms": 30, "met": False}]
    assert tail["ours_poisson_met"] is True
    text = markdown(found)
    assert "| 50 | 7.0 / 30.0 (1500) | 7.0 / 15.0 (1500) | +0% / -50% (p99) | 7.0 / 31.0 (1500) | +3% |" in text
    assert "wrk2, 32 connections: p99 30.0 ms: missed" in text


def test_under_a_thousand_requests_the_p90_stands_in() -> None:
    found = judge(_found(_figures(7, 10, 40, 900), _figures(7, 9, 30, 1500)))
    assert found["rates"][0]["tail"] == "p90"
    assert found["low_load_tail"]["quantile"] == "p90"
    assert found["low_load_tail"]["bound_ms"] == 14.0  # 2 x the one connection's p90
    assert "7.0 / p90 10.0 (900)" in markdown(found)


def test_reports_record_no_path_of_the_machine() -> None:
    argv = ["--model", "m", "--wrk", "/tmp/wrk2/wrk", "--capacity", "9"]
    assert crosscheck.without_paths(argv) == ["--model", "m", "--wrk", "<wrk2>", "--capacity", "9"]
    assert crosscheck.without_paths(["--wrk=/opt/wrk"]) == ["--wrk=<wrk2>"]
