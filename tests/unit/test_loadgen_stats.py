"""The load generator's arithmetic on synthetic timings: percentiles, windows, rates, stability;
the Prometheus diff; and the generator itself against a tiny local HTTP server (no TorchServe)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from benchmarks.load import loadgen, server_metrics, stats
from benchmarks.load.stats import NO_RESPONSE, Sample, StabilityRule, Window

pytestmark = pytest.mark.unit


def test_percentiles_match_numpy_linear_interpolation():
    rng = np.random.default_rng(1)
    values = sorted(rng.lognormal(3.0, 0.7, 1001).tolist())
    for q in stats.PERCENTILES + (0.0, 100.0):
        assert stats.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_edges():
    assert stats.percentile([5.0], 99.9) == 5.0
    assert stats.percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        stats.percentile([], 50)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summary_in_milliseconds_and_ordered():
    latencies = [i / 1000.0 for i in range(1, 1001)]  # 1..1000 ms
    s = stats.summarize(latencies)
    assert s.count == 1000 and s.max_ms == pytest.approx(1000.0)
    assert s.p50_ms == pytest.approx(500.5) and s.p99_ms == pytest.approx(990.01)
    assert s.p50_ms <= s.p90_ms <= s.p95_ms <= s.p99_ms <= s.p999_ms <= s.max_ms
    assert s.mean_ms == pytest.approx(500.5)
    assert stats.summarize([]) is None


def test_latency_counts_from_the_intended_time():
    late = Sample(intended=10.0, sent=10.3, done=10.4, status=200)
    assert late.latency == pytest.approx(0.4) and late.send_lag == pytest.approx(0.3)
    assert stats.late_fraction([late, Sample(1.0, 1.0, 1.1, 200)], 0.01) == 0.5


def test_errors_by_status():
    samples = [Sample(0, 0, 1, 200), Sample(0, 0, 1, 503), Sample(0, 0, 1, 503), Sample(0, 0, 1, NO_RESPONSE)]
    assert stats.errors_by_status(samples) == {"0": 1, "503": 2}


def test_window_counts_completions_inside_only():
    samples = [Sample(t, t, t + 0.05, 200) for t in np.arange(0.0, 2.0, 0.01)]  # 100 req/s, 50 ms each
    samples.append(Sample(0.5, 0.5, 0.6, 500))
    w = stats.window(samples, 1.0, 2.0)
    assert w.ok == 100 and w.completed == 100 and w.throughput_rps == pytest.approx(100.0)
    assert w.p99_ms == pytest.approx(50.0)
    first = stats.window(samples, 0.0, 1.0)
    assert first.completed == first.ok + 1 and first.ok == 95


def test_throughput_counts_successful_answers_in_the_interval():
    samples = [Sample(t, t, t + 0.1, 200) for t in np.arange(0.0, 10.0, 0.02)]  # 50 req/s
    assert stats.throughput(samples, 2.0, 8.0) == pytest.approx(50.0, rel=0.01)
    samples += [Sample(3.0, 3.0, 3.5, 503)] * 10
    assert stats.throughput(samples, 2.0, 8.0) == pytest.approx(50.0, rel=0.01)


def test_open_loop_rates():
    # 20 req/s scheduled over [0, 10); each answered 0.2 s later: the last 4 land after the interval.
    scheduled = np.arange(0.0, 10.0, 0.05)
    samples = [Sample(t, t, t + 0.2, 200) for t in scheduled]
    rates = stats.open_loop_rates(samples, 0.0, 10.0)
    assert rates.offered_rps == pytest.approx(20.0) and rates.scheduled == 200
    assert rates.achieved_rps == pytest.approx(19.6) and rates.achieved_rps <= rates.offered_rps
    assert rates.unanswered == 0 and rates.carried_in == 0
    # Measured over [1, 10): the answers to requests of [0.8, 1) land inside and are carried in.
    later = stats.open_loop_rates(samples, 1.0, 10.0)
    assert later.carried_in == 4 and later.achieved_rps - later.carried_in / 9.0 <= later.offered_rps
    # Overloaded: answers come at 10 req/s while 20 req/s are offered.
    slow = [Sample(t, t, 0.1 * (i + 1), 200) for i, t in enumerate(scheduled)]
    rates = stats.open_loop_rates(slow, 0.0, 10.0)
    assert rates.achieved_rps == pytest.approx(9.9) and rates.offered_rps == pytest.approx(20.0)
    # Failures are offered but not achieved; requests cut at the end of the drain are unanswered.
    mixed = [Sample(t, t, t + 0.1, 503 if i % 4 == 0 else 200) for i, t in enumerate(scheduled[:100])]
    mixed += [Sample(t, t, 12.0, NO_RESPONSE) for t in scheduled[100:]]
    rates = stats.open_loop_rates(mixed, 0.0, 10.0)
    assert rates.answered_ok == 75 and rates.achieved_rps == pytest.approx(7.5) and rates.unanswered == 100


def _windows(pairs):
    return [Window(i, i + 1, 1, 1, rps, p99) for i, (rps, p99) in enumerate(pairs)]


def test_within_means_each_value_near_the_mean():
    assert stats.within([70, 76, 68], 10)  # mean 71.3: every value within 6.6%
    assert not stats.within([100, 125], 10)  # mean 112.5: 11.1% off
    assert stats.within([100, 120], 10)  # mean 110: 9.1% off
    assert not stats.within([100, None, 100], 10) and not stats.within([], 10)


def test_stability_rule():
    rule = StabilityRule(tolerance_pct=10, last=3, max_windows=5, warmup=1)
    # The wild warm-up window is ignored; three measured windows within 10%: stable.
    assert rule.is_stable(_windows([(5, 900), (100, 50), (104, 52), (108, 54)]))
    # Only two measured windows so far.
    assert not rule.is_stable(_windows([(100, 50), (100, 50), (100, 50)]))
    # Throughput 100/125/100 (one window 15% off the mean): not stable; same for p99.
    assert not rule.is_stable(_windows([(0, 0), (100, 50), (125, 50), (100, 50)]))
    assert not rule.is_stable(_windows([(0, 0), (100, 50), (100, 65), (100, 50)]))
    # A window with no answers (p99 None) is never stable.
    assert not rule.is_stable(_windows([(0, 0), (100, 50), (100, None), (100, 50)]))
    # Only the last three count.
    assert rule.is_stable(_windows([(0, 0), (10, 500), (100, 50), (101, 50), (99, 51)]))
    # Bounded: finished after max_windows measured windows even if unstable.
    unstable = _windows([(0, 0)] + [(100 * (i % 2) + 50, 50) for i in range(5)])
    assert not rule.is_stable(unstable) and rule.finished(unstable)
    assert not rule.finished(unstable[:-1])
    assert [w.start for w in rule.reported(unstable)] == [3, 4, 5]


def test_stability_rule_validation():
    with pytest.raises(ValueError):
        StabilityRule(last=3, max_windows=2)
    with pytest.raises(ValueError):
        StabilityRule(tolerance_pct=0)


def test_sweep_levels_and_gain_rule():
    assert loadgen.concurrency_levels(64) == (1, 2, 4, 8, 16, 32, 64)
    assert loadgen.concurrency_levels(12) == (1, 2, 4, 8, 12)
    assert loadgen.gained([10.0], 5)
    assert loadgen.gained([10.0, 20.0], 5)
    assert not loadgen.gained([10.0, 20.0, 20.9], 5)  # +4.5% over the best: stop
    assert not loadgen.gained([10.0, 20.0, 18.0], 5)


class _Fixed:
    def __init__(self, rps):
        self.rps = rps

    def figures(self):
        return {"throughput_rps": self.rps}


def test_closed_sweep_stops_when_the_gain_is_small():
    measured = {1: 10.0, 2: 19.0, 4: 19.5, 8: 30.0}
    ran = []

    def run_level(level):
        ran.append(level)
        return _Fixed(measured[level])

    results = loadgen.closed_sweep((1, 2, 4, 8), run_level, 5.0, progress=lambda _: None)
    assert ran == [1, 2, 4] and [r.rps for r in results] == [10.0, 19.0, 19.5]
    assert len(loadgen.closed_sweep((1, 2, 4, 8), run_level, None, progress=lambda _: None)) == 4


PROMETHEUS = """\
# TYPE ts_queue_latency_microseconds counter
ts_queue_latency_microseconds{model_name="m",model_version="default",hostname="vm",} 3000.0
ts_inference_requests_total{model_name="m",model_version="default",hostname="vm",} 10.0
ts_inference_latency_microseconds{model_name="m",model_version="default",hostname="vm",} 500000.0
HandlerInferenceMs{ModelName="m",Level="Model",Hostname="vm",} 80.0
HandlerPreprocessMs{ModelName="m",Level="Model",Hostname="vm",} 20.0
HandlerBatches{ModelName="m",Level="Model",BatchSize="1",Hostname="vm",} 2.0
HandlerBatches{ModelName="m",Level="Model",BatchSize="4",Hostname="vm",} 2.0
HandlerItems{ModelName="m",Level="Model",Hostname="vm",} 10.0
HandlerItems{ModelName="other",Level="Model",Hostname="vm",} 99.0
"""


def test_prometheus_diff():
    before = server_metrics.Scrape.of(PROMETHEUS)
    after_text = (PROMETHEUS.replace("3000.0", "13000.0").replace("} 10.0", "} 20.0", 1)
                  .replace("500000.0", "1500000.0").replace("} 80.0", "} 280.0").replace("} 20.0\nHandlerBatches", "} 40.0\nHandlerBatches")
                  .replace('BatchSize="4",Hostname="vm",} 2.0', 'BatchSize="4",Hostname="vm",} 4.0')
                  .replace('HandlerItems{ModelName="m",Level="Model",Hostname="vm",} 10.0',
                           'HandlerItems{ModelName="m",Level="Model",Hostname="vm",} 18.0'))
    b = server_metrics.breakdown(before, server_metrics.Scrape.of(after_text), "m")
    assert b.requests == 10
    assert b.queue_ms_per_request == pytest.approx(1.0)
    assert b.frontend_ms_per_request == pytest.approx(100.0)
    assert dict(b.batch_sizes) == {"4": 2} and b.batches == 2 and b.items == 8
    assert b.mean_batch_size == pytest.approx(4.0)
    assert b.stage_ms_per_batch["inference"] == pytest.approx(100.0)
    assert b.handler_ms_per_batch == pytest.approx(110.0)


def test_prometheus_diff_without_our_counters():
    """The stock baseline emits no Handler* counters: stage figures are absent, not zero."""
    text = "\n".join(line for line in PROMETHEUS.splitlines() if not line.startswith("Handler"))
    b = server_metrics.breakdown(server_metrics.Scrape.of(text), server_metrics.Scrape.of(text), "m")
    assert b.requests == 0 and b.batches == 0 and b.stage_ms_per_batch == {} and b.handler_ms_per_batch is None


# -- the generator itself, against a local HTTP server that answers in 20 ms ----------------
SLOW_S = 20.0  # the "slow" payload's answer time: far beyond any drain under test
class _Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(SLOW_S if self.headers.get("Content-Type") == "application/slow" else 0.02)
        status = b"503 Unavailable" if self.headers.get("Content-Type") == "application/fail" else b"200 OK"
        # One write for the whole answer (no Nagle / delayed-ACK stall between headers and body).
        self.wfile.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")

    def log_message(self, *args):
        pass


@pytest.fixture()
def local_target():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield loadgen.Target("127.0.0.1", server.server_address[1], "/predictions/x", token="t", timeout_s=5)
    server.shutdown()
    server.server_close()


def test_closed_loop_against_a_local_server(local_target):
    rule = StabilityRule(tolerance_pct=50, last=2, max_windows=3, warmup=1)
    result = loadgen.closed_loop(local_target, [loadgen.Payload(b"x", "text/plain")], 2, rule, 0.5,
                                 progress=lambda _: None)
    f = result.figures()
    # Bounds that hold however loaded the machine is: the server sleeps 20 ms per request, so two
    # clients can never exceed 100 req/s, and no answer comes back in under 20 ms.
    assert 0 < f["throughput_rps"] <= 100 and f["latency_ms"]["p50_ms"] >= 20 and f["errors"] == {}
    # Little's law on the recorded samples: two clients always busy means, over the reported
    # interval, summed request time = 2 x its length (up to the requests cut at its two edges).
    start, end = result.interval
    busy = sum(min(s.done, end) - max(s.sent, start) for s in result.samples if s.done > start and s.sent < end)
    assert busy == pytest.approx(2 * (end - start), rel=0.05)
    assert len(result.edges) == len(result.windows) + 1


def test_open_loop_against_a_local_server(local_target):
    rule = StabilityRule(tolerance_pct=200, last=2, max_windows=2, warmup=1)
    payloads = [loadgen.Payload(b"x", "text/plain"), loadgen.Payload(b"y", "application/fail")]
    result = loadgen.open_loop(local_target, payloads, 40.0, rule, 1.0, connections=8, progress=lambda _: None)
    f = result.figures()
    # Arrivals follow the seeded schedule whatever the machine does (latency counts from it), so
    # the offered rate is the Poisson count over the interval: within 4 sigma of 40 req/s.
    scheduled = f["offered_rps"] * f["seconds"]
    assert abs(scheduled - 40.0 * f["seconds"]) <= 4 * (40.0 * f["seconds"]) ** 0.5
    # Every other payload fails: the answers split evenly between 200 and 503.
    answered = [s for s in result.samples if s.status in (200, 503)]
    assert abs(sum(s.status == 200 for s in answered) - len(answered) / 2) <= 1
    assert set(f["errors"]) == {"503"} and f["latency_ms"]["p50_ms"] >= 20


def test_open_loop_drain_is_bounded(local_target):
    """Answers still missing when the drain time is up count as failed; the point ends on time."""
    rule = StabilityRule(tolerance_pct=200, last=1, max_windows=1, warmup=0)
    began = time.perf_counter()
    result = loadgen.open_loop(local_target, [loadgen.Payload(b"x", "application/slow")], 20.0, rule, 0.5,
                               connections=4, drain_s=0.3, progress=lambda _: None)
    # Half a second of load and 0.3 s of drain: the point must end long before the first slow
    # answer could (SLOW_S), however slow the machine.
    assert time.perf_counter() - began < SLOW_S / 2
    assert result.samples and all(s.status == NO_RESPONSE for s in result.samples)
    figures = result.figures()
    assert figures["throughput_rps"] == 0.0 and result.max_busy == 4
    assert figures["unanswered"] == pytest.approx(figures["offered_rps"] * figures["seconds"])
    assert figures["unanswered"] > 0


def test_process_usage_and_the_rest_of_the_machine():
    from benchmarks.load import resources

    before = resources.Reading(10.0, {"frontend": 1.0, "workers": 5.0, "machine": 100.0},
                               {"frontend": 0, "workers": 0, "machine": 0})
    after = resources.Reading(12.0, {"frontend": 1.5, "workers": 7.0, "machine": 104.0},
                              {"frontend": 200 * 2**20, "workers": 300 * 2**20, "machine": 0})
    used = resources.usage(before, after)
    assert used["frontend"].cpu_pct == pytest.approx(25.0) and used["workers"].cpu_pct == pytest.approx(100.0)
    assert used["others"].cpu_pct == pytest.approx(75.0)  # 200% busy, 125% of it ours
    assert used["workers"].rss_mb == pytest.approx(300.0) and "machine" not in used


def _point(mode: str, rps: float, p99: float, errors: dict = None):
    from benchmarks.load.runner import Measured

    figures = {"mode": mode, "level": rps, "throughput_rps": rps, "latency_ms": {"p99_ms": p99},
               "errors": errors or {}, "unanswered": 0}
    return Measured(figures, ())


def test_latency_target_counts_open_loop_points_only():
    from benchmarks.load.runner import best_within, peak

    points = [_point("closed", 300.0, 40.0), _point("open", 150.0, 45.0), _point("open", 250.0, 80.0),
              _point("open", 200.0, 30.0, errors={"503": 1})]
    assert best_within(points, 50.0)["throughput_rps"] == 150.0  # closed 300 has the better p99 but hides queueing
    # The peak is the closed-loop sweep's: open-loop overloads and a lone client are no peak.
    assert peak(points) is None  # one closed-loop level is no sweep
    sweep = [_point("closed", 120.0, 20.0), *points]
    sweep[0].figures["level"] = 1
    assert peak(sweep)["throughput_rps"] == 300.0
    assert peak([*sweep, _point("open", 400.0, 900.0)])["throughput_rps"] == 300.0
    assert best_within(points[:1], 50.0) is None


def test_a_point_that_does_not_keep_up_does_not_pass():
    from benchmarks.load.capacity import Point

    behind = dict(_point("open", 300.0, 40.0).figures, offered_rps=400.0)  # served 75% of what was sent
    assert not Point.of(behind).passes(50.0)
    assert Point.of(_point("open", 300.0, 40.0).figures).passes(50.0)
    assert not Point.of(dict(_point("open", 300.0, 40.0).figures, unanswered=3)).passes(50.0)


def test_capacity_search_bisects_between_the_listed_rates():
    """The benchmark's listed rates bracket the capacity coarsely (here 200 passes, 300 does not);
    the search measures only between them, to the tuner's resolution."""
    from benchmarks.load.capacity import Point, RateSettings
    from benchmarks.load.runner import capacity_search

    def server(rate: float) -> Point:  # p99 crosses 50 ms at 260 req/s
        return Point.of(_point("open", rate, 50.0 * (rate / 260.0) ** 4).figures)

    probed = []

    def probe(rate: float) -> Point:
        probed.append(rate)
        return server(rate)

    listed = [server(100.0), server(200.0), server(300.0)]
    found = capacity_search(probe, listed, 50.0, RateSettings(max_points=6))
    assert probed and all(200.0 < r < 300.0 for r in probed)
    assert 260.0 / 1.06 <= found.best.rate_rps <= 260.0
    # Every listed rate passes: it climbs from the highest; none passes: it steps down from the lowest.
    probed.clear()
    found = capacity_search(probe, listed[:2], 50.0, RateSettings(max_points=6))
    assert probed[0] == 250.0 and 260.0 / 1.06 <= found.best.rate_rps <= 260.0
    probed.clear()
    found = capacity_search(probe, [server(400.0)], 50.0, RateSettings(max_points=6))
    assert probed[0] == 320.0 and found.best is not None and found.best.rate_rps <= 260.0
    # Bracketed to the resolution already: nothing more to measure.
    probed.clear()
    capacity_search(probe, [server(255.0), server(265.0)], 50.0, RateSettings(max_points=6))
    assert probed == []


def test_served_path_targets_meet_and_miss():
    from benchmarks.bench import targets
    from benchmarks.load.runner import Measured, ServerRun

    def figures(mode, level, rps, p50, p99):
        return {"mode": mode, "level": level, "throughput_rps": rps, "errors": {}, "unanswered": 0,
                "latency_ms": {"p50_ms": p50, "p99_ms": p99}}

    one = figures("closed", 1, 100.0, 9.0, 14.0)
    low_ok, low_slow = figures("open", 60, 60.0, 10.0, 25.0), figures("open", 90, 90.0, 12.0, 31.0)
    run = ServerRun("ours", tuple(Measured(f, ()) for f in (one, low_ok, low_slow)), (1, 1), {})
    summary = {"slo_ms": 50.0, "ours": {"slo_rps": 300.0}}
    rows = targets.check(run, summary, {"items_per_s": 400.0, "batch1_ms": 5.5}, {"combined_limit_rps": 350.0})
    assert [r["met"] for r in rows] == [True, True, False, True]  # 25 <= 28 ms; 31 > 28 ms; 300 >= min(280, 315)
    slow = targets.check(run, {"slo_ms": 50.0, "ours": {"slo_rps": 270.0}}, {"items_per_s": 400.0, "batch1_ms": 4.0},
                         None)
    assert slow[0]["met"] is False and slow[-1]["met"] is False  # 9 > 8 ms; 270 < 280 (no ceiling measured)
    assert "**missed**" in "\n".join(targets.markdown(slow))
