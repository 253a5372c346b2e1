"""The reliability checks' verdicts, on synthetic figures (no server): accounting, bounds, growth."""

from types import MappingProxyType

import pytest

from benchmarks.load.stats import NO_RESPONSE, Sample
from benchmarks.load.traffic import Traffic
from benchmarks.reliability.badinput import mixed_groups
from benchmarks.reliability.corpus import family_cases
from benchmarks.reliability.faults import KillResult
from benchmarks.reliability.findings import Findings, table
from benchmarks.reliability.overload import OverloadResult, p99_bound_ms
from benchmarks.reliability.soak import Point, SoakResult
from handlers.families.image_settings import ImageSettings

pytestmark = pytest.mark.unit


def samples(*statuses):
    return [Sample(i, i, i + 0.1, s) for i, s in enumerate(statuses)]


def test_traffic_counts_no_answer_and_unrecorded_requests_as_lost():
    traffic = Traffic.of(samples(200, 200, 503, NO_RESPONSE), sent=5)
    assert (traffic.sent, traffic.answered, traffic.ok, traffic.lost) == (5, 3, 2, 2)
    assert dict(traffic.errors) == {"503": 1}
    total = traffic + Traffic.of(samples(503, 507))
    assert (total.sent, total.answered, total.lost) == (7, 5, 2) and dict(total.errors) == {"503": 2, "507": 1}


def soak_result(workers_mb, errors=0):
    points = tuple(Point(5.0 * i, 10.0, 50.0, 0, MappingProxyType({"frontend": 200.0, "workers": mb}))
                   for i, mb in enumerate(workers_mb))
    traffic = Traffic(100, 100, 100 - errors, MappingProxyType({"500": errors} if errors else {}))
    return SoakResult("m", 10.0, 7.0, 1.0, points, 2, traffic, 50.0)


def test_soak_growth_compares_after_warm_up_with_the_end():
    flat = soak_result([300, 350, 400, 400, 401, 399, 400, 400, 402, 401])  # warm-up growth is ignored
    assert flat.growth_pct("workers") == pytest.approx(0.25) and flat.passed  # floors 400 -> 401
    spiky = soak_result([300, 350, 400, 450, 400, 400, 460, 400, 470, 400])  # transient buffers, no leak
    assert spiky.growth_pct("workers") == pytest.approx(0.0) and spiky.passed
    leaking = soak_result([400, 400, 400, 410, 420, 430, 440, 450, 460, 470])  # floors 400 -> 460
    assert leaking.growth_pct("workers") > 5 and not leaking.passed
    assert any("workers RSS grew" in p for p in leaking.problems)
    assert any("not every request" in p for p in soak_result([400] * 10, errors=1).problems)


def overload_result(**changes):
    values = dict(model="m", capacity_rps=10.0, offered_rps=30.0, seconds=15.0, job_queue_size=16,
                  traffic=Traffic(450, 450, 150, MappingProxyType({"503": 300})), p99_ok_ms=2000.0,
                  p99_bound_ms=p99_bound_ms(16 + 2 * 8, 10.0), rss_before=MappingProxyType({"frontend": 100, "workers": 100}),
                  rss_peak=MappingProxyType({"frontend": 120, "workers": 110}), healthy_after=())
    values.update(changes)
    return OverloadResult(**values)


def test_overload_verdicts():
    assert p99_bound_ms(16 + 2 * 8, 10.0) == pytest.approx(1000 * (2 * 32 / 10 + 0.5))
    assert overload_result().passed and overload_result().rejected_503 == 300
    no_503 = overload_result(traffic=Traffic(450, 450, 450))
    assert any("never filled" in p for p in no_503.problems)
    assert any("over the bound" in p for p in overload_result(p99_ok_ms=60_000.0).problems)
    assert any("workers RSS grew" in p for p in overload_result(rss_peak=MappingProxyType({"frontend": 100, "workers": 200})).problems)
    assert any("no answer" in p for p in overload_result(traffic=Traffic(451, 450, 150, MappingProxyType({"503": 300}))).problems)
    assert overload_result(healthy_after=("queue not drained",)).problems == ("queue not drained",)
    assert overload_result(served_rps=5.0).passed  # half the capacity of 10: slowed, not collapsed
    assert any("throughput collapsed" in p for p in overload_result(served_rps=1.0).problems)


def test_the_overload_report_puts_the_engines_side_by_side(tmp_path):
    import json

    from benchmarks.load.stats import summarize
    from benchmarks.reliability import overload_report

    slow = summarize([7.9] * 1000)
    results = [overload_result(served_rps=5.0, accepted=summarize([0.1] * 1000), refused=summarize([0.002] * 1000),
                               timeline=((0, 50, 100.0, 100, 2.0), (1, 50, 110.0, 100, 3.0))),
               overload_result(engine="ray", served_rps=8.0, p99_ok_ms=slow.p99_ms, accepted=slow,
                               refused=summarize([0.05] * 1000), timeline=((0, 80, 7900.0, 70, 50.0),))]
    report = overload_report.write(tmp_path, results, "python -m benchmarks overload --engine torchserve,ray")
    text = report.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| TorchServe") or line.startswith("| Ray")]
    assert len(rows) == 2 and "| passed |" in rows[0] and "FAILED: accepted p99 7900 ms over the bound" in rows[1]
    assert "5.0 (0.50x)" in rows[0] and "100 / 100" in rows[0] and "7900 / 7900" in rows[1]
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [r["engine"] for r in saved["results"]] == ["torchserve", "ray"]
    assert (tmp_path / "overload.png").stat().st_size > 0


def test_kill_verdicts():
    good = KillResult("m", 11, (12,), 8.0, 8.5, Traffic(40, 40, 36, MappingProxyType({"507": 4})), 0)
    assert good.passed
    assert not KillResult("m", 11, (12,), None, None, Traffic(40, 40, 36), 0).passed
    assert not KillResult("m", 11, (12,), 8.0, 8.5, Traffic(41, 40, 36), 0).passed  # one request vanished
    assert not KillResult("m", 11, (12,), 8.0, 8.5, Traffic(40, 40, 36), 2).passed


class _Described:
    """A server's worker views as the launchers give them (TorchServe's from its describe call)."""

    def __init__(self, workers):
        self.workers = workers

    def worker_pids(self, model):
        return tuple(w["pid"] for w in self.workers if w["pid"] > 0)

    def ready_worker_pids(self, model):
        return tuple(sorted(w["pid"] for w in self.workers if w["status"] == "READY" and w["pid"] > 0))


@pytest.mark.parametrize("workers, recovered", [
    ([{"pid": 12, "status": "READY"}], True),  # one worker, replaced
    ([{"pid": 11, "status": "READY"}], False),  # the killed pid still listed
    ([{"pid": 13, "status": "READY"}, {"pid": -1, "status": "UNLOADING"}], False),  # sibling only
    ([{"pid": 13, "status": "READY"}, {"pid": 12, "status": "STARTING"}], False),  # replacement not READY
    ([{"pid": 13, "status": "READY"}, {"pid": 12, "status": "READY"}], True),
])
def test_recovery_waits_for_the_replacement_not_a_sibling(workers, recovered):
    from benchmarks.reliability.faults import _ready_replacement

    before = (11,) if len(workers) == 1 else (11, 13)
    assert bool(_ready_replacement(_Described(workers), "m", before, 11)) is recovered


def test_corpus_groups_mix_invalid_and_valid_and_cover_every_case():
    corpus = family_cases("image_classifier", ImageSettings())
    groups = mixed_groups(corpus, 2)
    sent = {c for g in groups for c in g}
    assert sent == set(corpus)
    assert all(any(c.valid for c in g) for g in groups)
    assert sum(any(not c.valid for c in g) for g in groups) >= len(groups) - 1


def test_table_lists_every_row_with_a_verdict():
    findings = Findings(kill=KillResult("m", 11, (12,), 8.0, 8.5, Traffic(40, 40, 36), 0), errors=("soak: boom",))
    text = table(findings.rows())
    assert "faults injected / survived" in text and "1 / 1" in text
    assert "requests sent / answered / lost" in text and "40 / 40 / 0" in text
    assert "could not run" in text and "FAIL" in text and not findings.passed


def test_soak_server_keeps_the_configs_vmargs_and_adds_its_heap_settings(tmp_path):
    from benchmarks.reliability.soak import soak_vmargs

    config = tmp_path / "config.properties"
    config.write_text("vmargs=-Xmx1g\n")
    assert soak_vmargs(config) == {"vmargs": "-Xmx1g -Xms512m -XX:+AlwaysPreTouch"}
    config.write_text("vmargs=-Xms2g -XX:+AlwaysPreTouch\n")
    assert soak_vmargs(config) == {"vmargs": "-Xms2g -XX:+AlwaysPreTouch"}
    config.write_text("inference_address=http://127.0.0.1:8080\n")
    assert soak_vmargs(config) == {"vmargs": "-Xms512m -XX:+AlwaysPreTouch"}


def test_deadline_overload_sorts_every_request_into_one_outcome():
    from benchmarks.reliability.deadlines import OUTCOMES, outcomes

    done = [Sample(0.0, 0.0, 0.05, 200), Sample(0.0, 0.0, 0.5, 200), Sample(0.0, 0.0, 0.01, 503),
            Sample(0.0, 0.0, 0.2, 504), Sample(0.0, 0.0, 0.2, 500), Sample(0.0, 0.0, 0.2, 400),
            Sample(0.0, 0.0, 60.0, NO_RESPONSE)]
    counted = outcomes(done, budget_ms=100)
    assert counted == dict(zip(OUTCOMES, [1, 1, 1, 1, 1, 1, 1]))


def test_deadline_stamp_sends_the_budget_and_the_intended_send_time():
    import time

    from benchmarks.reliability.deadlines import deadline_stamp
    from handlers.deadlines import START_HEADER, TIMEOUT_HEADER

    intended = time.perf_counter() - 0.5  # meant to go half a second ago
    headers = deadline_stamp(200)(intended)
    assert headers[TIMEOUT_HEADER] == "200"
    assert abs(int(headers[START_HEADER]) - (time.time() - 0.5) * 1000) < 50


def test_deadline_overload_rows_and_verdicts():
    from benchmarks.reliability.deadlines import OUTCOMES, DeadlineComparison, RunFigures

    def run(label, counts):
        outcomes = MappingProxyType(dict(zip(OUTCOMES, counts)))
        sent = sum(counts)
        return RunFigures(label, label == "deadline", 80.0, 20.0, Traffic(sent, sent - counts[-1], counts[0] + counts[1]),
                          outcomes, None, 0.0, ())

    good = DeadlineComparison("m", 100.0, 200, 40.0, 2.0, 100, 3,
                              (run("no deadline", [5, 795, 800, 0, 0, 0, 0]), run("deadline", [700, 100, 0, 800, 0, 0, 0])),
                              0.0)
    assert good.passed and "answered within 200 ms" in table(Findings(deadline_overload=good).rows())
    assert "0% -> 44%" in table(Findings(deadline_overload=good).rows())
    bad = DeadlineComparison("m", 100.0, 200, 40.0, 2.0, 100, 3,
                             (run("no deadline", [5, 795, 790, 10, 0, 0, 0]), run("deadline", [700, 100, 0, 790, 9, 0, 1])),
                             0.0)
    assert len(bad.problems) == 3 and not Findings(deadline_overload=bad).passed
