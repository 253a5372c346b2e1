"""The generation tuner's counting rules: a TTFT p99 near the SLO, either side, is measured again
and the median decides; the written record holds the re-measurement from the written file, and one
over the SLO fails the tune."""

from __future__ import annotations

import shutil

from benchmarks.tune import generation
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ModelSettings

SETTINGS = ModelSettings(batch_size=1, max_batch_delay_ms=1, min_workers=1, max_workers=1, threads=1)


def candidate(p99: float, tokens_per_s: float = 1000.0) -> generation.Candidate:
    return generation.Candidate(SETTINGS, tokens_per_s, p99, 1000, p99 / 2, 8)


def replay(*p99s: float):
    """A stand-in for one served measurement: the given p99s in turn, and how many were taken."""
    taken = []

    def measure_once() -> generation.Candidate:
        taken.append(p99s[len(taken)])
        return candidate(taken[-1], tokens_per_s=10 * len(taken))

    return measure_once, taken


def test_a_p99_far_from_the_slo_is_measured_once():
    for p99 in (40.0, 79.0, 126.0, 300.0):
        measure_once, taken = replay(p99, 1.0, 1.0)
        assert generation.judged(measure_once, 100.0, lambda _: None).ttft_p99_ms == p99
        assert len(taken) == 1


def test_a_near_pass_and_a_near_miss_are_each_measured_twice_more_and_the_median_decides():
    measure_once, taken = replay(90.0, 130.0, 105.0)  # a near pass that the median turns into a miss
    result = generation.judged(measure_once, 100.0, lambda _: None)
    assert len(taken) == 3 and result.ttft_p99_ms == 105.0 and result.tokens_per_s == 30.0
    assert result.remeasured_p99_ms == (90.0, 130.0, 105.0)
    measure_once, taken = replay(110.0, 70.0, 95.0)  # a near miss the median lets pass
    assert generation.judged(measure_once, 100.0, lambda _: None).ttft_p99_ms == 95.0 and len(taken) == 3


def test_a_verification_over_the_slo_fails_the_tune_and_says_so_in_the_record(tmp_path, monkeypatch):
    config = tmp_path / "config.properties"
    shutil.copy(DEFAULT_CONFIG, config)
    model = "tinylm"
    search = iter([40.0, 300.0])  # the search: one layout under two loads (the first passes, far from the SLO)
    verification = iter([150.0])  # the written file: far over the SLO

    def fake_measure(store, name, settings, samples, config=None, clients=0):
        return candidate(next(verification) if config else next(search))

    monkeypatch.setattr(generation, "measure", fake_measure)
    monkeypatch.setattr(generation, "is_async", lambda archive: True)
    monkeypatch.setattr(generation, "search_space", lambda asynchronous, cores: [(SETTINGS, 8), (SETTINGS, 16)])
    rc = generation.tune(model, 100.0, tmp_path, config, tmp_path / "reports", 2, True, 1000, "tune", lambda _: None)
    assert rc == 1
    text = config.read_text()
    assert "verification FAILED: TTFT p99 150 ms against the SLO" in text and "search only" not in text
    report = next((tmp_path / "reports").glob("tune-tinylm-*/report.md")).read_text()
    assert "verification FAILED" in report

    search, verification = iter([40.0, 300.0]), iter([60.0])
    rc = generation.tune(model, 100.0, tmp_path, config, tmp_path / "again", 2, True, 1000, "tune", lambda _: None)
    assert rc == 0 and "verified from the written file" in config.read_text()
