"""The tuner's search against a synthetic server (no TorchServe): it must find the known optimum,
cheaply, and resume from its checkpoint without measuring anything twice."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from benchmarks.load.capacity import RateSettings, find_max_rate
from benchmarks.tune import service_model
from benchmarks.tune.checkpoint import Checkpoint
from benchmarks.tune.errors import CheckpointError, TuneError
from benchmarks.tune.rates import evaluate
from benchmarks.tune.results import CandidateResult, Point, best_of
from benchmarks.tune.search import (
    Fixed,
    ModelGuided,
    Proposal,
    SearchResult,
    SearchSettings,
    preferred,
    run,
    shorter_delay,
)
from benchmarks.tune.service_model import (
    LinearServiceTime,
    Observation,
    Overhead,
    ServiceModel,
    max_rate_within,
    simulate,
)
from benchmarks.tune.space import Candidate, Space, preset, torchserve_defaults

pytestmark = pytest.mark.unit

SLO_MS = 100.0
# What the in-process fit believes: 2 threads make one worker much faster than 1 thread...
FITTED = ServiceModel(MappingProxyType({1: LinearServiceTime(4.0, 9.0), 2: LinearServiceTime(4.0, 4.0)}))
SPACE = preset("reduced", cores=2)


def collapsing(candidate: Candidate):
    """Served truth 1: 2 threads next to the frontend collapse (x4); two 1-thread workers pay a
    little for sharing (x1.2). The optimum is a 2-worker candidate the first predictions do not
    rank first: the search has to learn it from measurements."""
    scale = {1: 4.0, 2: 1.2}[candidate.workers]
    return lambda b: scale * FITTED.by_threads[candidate.threads](b)


def overheads(candidate: Candidate):
    """Served truth 2: what this machine showed, roughly: every batch pays 3 ms of IPC and every
    request 4 ms of frontend and generator CPU taken from the workers' cores."""
    return lambda b: FITTED.by_threads[candidate.threads](b) + 3.0 + 4.0 * b / candidate.threads


def quiet(line: str) -> None:
    pass


@pytest.fixture(scope="module", autouse=True)
def remembered_simulations():
    """The search's predictions simulate the same traffic through the same service times over and
    over (every round ranks every candidate again; a test's searches retrace one path). The
    simulation is a pure function of those numbers (s(b) for the batch sizes it can form, and its
    arguments), so its results are remembered here: the same answers, a fraction of the seconds."""
    real, seen = service_model.simulate, {}

    def simulate(service_ms, workers, batch_size, delay_ms, rate_rps, *args, **kwargs):
        key = (tuple(service_ms(b) for b in range(1, batch_size + 1)), workers, batch_size, delay_ms, rate_rps,
               args, tuple(sorted(kwargs.items())))
        if key not in seen:
            seen[key] = real(service_ms, workers, batch_size, delay_ms, rate_rps, *args, **kwargs)
        return seen[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(service_model, "simulate", simulate)
        yield


def search(measurer, prior=(), settings: SearchSettings = SearchSettings()):
    """The model-guided strategy over SPACE, run through `measurer`."""
    strategy = ModelGuided(SPACE.candidates(), FITTED, SLO_MS, settings, prior, progress=quiet)
    return strategy.result(run(strategy, measurer, SLO_MS, quiet))


# An exhaustive grid, model-free: every candidate, climbing from a low rate by doubling.
GRID_RATES = RateSettings(step=2.0, resolution=1.06, max_points=12)


def grid(measurer):
    return run(Fixed([Proposal(c, 8.0) for c in SPACE.candidates()], "grid", GRID_RATES), measurer, SLO_MS,
               quiet).results


class SyntheticServer:
    """A measurer: a candidate at a rate through the batching simulation and the true service times."""

    def __init__(self, truth=collapsing, fail_after: int = -1) -> None:
        self.truth = truth
        self.calls = []
        self.fail_after = fail_after

    def finish(self) -> None:
        pass

    def measure(self, phase: str, candidate: Candidate, rate: float) -> Point:
        if len(self.calls) == self.fail_after:
            raise KeyboardInterrupt("simulated Ctrl-C")
        first = not self.calls or self.calls[-1][0] != candidate.key
        self.calls.append((candidate.key, rate))
        service = self.truth(candidate)
        sim = simulate(service, candidate.workers, candidate.batch_size, candidate.max_batch_delay_ms, rate, seed=7)
        capacity = 1000.0 * candidate.workers * candidate.batch_size / service(candidate.batch_size)
        served = rate if sim.utilisation < 0.97 else min(rate, capacity) * 0.97  # overloaded: about its capacity
        return Point(candidate.key, rate, rate, served, sim.p99_ms / 2, sim.p99_ms, 0, seconds=10.0,
                     overhead_s=15.0 if first else 0.0, mean_batch=sim.mean_batch)


def true_best_rates(space: Space, truth=collapsing) -> dict:
    """Ground truth: every candidate's highest passing rate, found finely."""
    server = SyntheticServer(truth)
    fine = RateSettings(step=1.5, resolution=1.01, max_points=60)
    out = {}
    for c in space.candidates():
        found = find_max_rate(lambda r, c=c: server.measure("truth", c, r), 20.0, SLO_MS, fine)
        out[c.key] = found.best.achieved_rps if found.best else 0.0
    return out


@pytest.fixture(scope="module")
def truth() -> dict:
    return true_best_rates(SPACE)


def test_first_prediction_is_misled(truth):
    """The scenario is a real test: the uncalibrated model prefers the wrong worker count."""
    optimum = max(truth, key=truth.get)
    ranked = sorted(SPACE.candidates(), key=lambda c: -FITTED.predict(c, SLO_MS).rate_rps)
    assert ranked[0].workers == 1 and optimum.startswith("w2-")


@pytest.mark.parametrize("world", [collapsing, overheads])
def test_search_finds_the_known_optimum_cheaply(world):
    truth = true_best_rates(SPACE, world)
    server = SyntheticServer(world)
    result = search(server)
    optimum = max(truth.values())
    chosen = result.chosen.candidate.key
    # The optimum, up to near-ties: the top candidates lie within a few % of each other, and a
    # rate is found to the search's 6% resolution (the target for the search: >= 95%).
    assert truth[chosen] >= 0.95 * optimum, (chosen, truth[chosen], optimum)
    assert result.chosen.throughput_rps >= 0.9 * optimum
    assert len(result.results) <= len(SPACE.candidates()) // 3
    # The exhaustive grid agrees and costs far more.
    every = grid(SyntheticServer(world))
    assert best_of(every).throughput_rps <= optimum * 1.01
    assert result.seconds < 0.15 * sum(r.seconds for r in every)
    if world is collapsing:  # it learned the truth: 1 worker carries far more served overhead than 2
        assert result.model.overhead(1)(4) > 3 * result.model.overhead(2)(4) > 0


def test_defaults_as_prior_calibrate_and_can_win(truth):
    defaults = torchserve_defaults(2)
    server = SyntheticServer()
    prior = evaluate(defaults, 50.0, SLO_MS, server, "defaults", RateSettings())
    result = search(server, prior=(prior,))
    assert result.results[0] is prior
    assert all(r.candidate.behaviour != prior.candidate.behaviour for r in result.results[1:])  # not twice
    assert truth[result.chosen.candidate.key] >= 0.95 * max(truth.values())
    # The defaults alone calibrate 2 workers; 1 worker keeps the benefit of the doubt until measured.
    seen = Observation(defaults, prior.throughput_rps, prior.best.mean_batch)
    only_prior = FITTED.calibrated({2: [seen]}, SLO_MS)
    assert only_prior.overhead(1)(4) == 0.0 and FITTED.overhead(1)(4) == 0.0
    overhead = only_prior.overhead(2)
    assert overhead.per_batch_ms == pytest.approx(overhead.per_request_ms * prior.best.mean_batch)  # split evenly
    # Self-consistent: the calibrated model predicts what was measured (within the fit's tolerance)
    assert only_prior.predict(defaults, SLO_MS).rate_rps == pytest.approx(prior.throughput_rps, rel=0.05)


def test_calibration_reproduces_each_observation_and_resists_one_outlier():
    a, b, c = Candidate(2, 1, 8, 2), Candidate(2, 1, 4, 2), Candidate(2, 1, 2, 10)
    one = FITTED.calibrated({2: [Observation(a, 120.0, 2.0)]}, SLO_MS)
    assert one.predict(a, SLO_MS).rate_rps == pytest.approx(120.0, rel=0.05)
    # Two agreeing candidates and one far-off reading: the median scale follows the two.
    agreeing = FITTED.calibrated({2: [Observation(a, 120.0, 2.0), Observation(b, 120.0, 2.0)]}, SLO_MS)
    noisy = FITTED.calibrated({2: [Observation(a, 120.0, 2.0), Observation(b, 120.0, 2.0),
                                   Observation(c, 5.0, 2.0)]}, SLO_MS)
    low, high = sorted(FITTED.scale_matching(Observation(k, 120.0, 2.0), SLO_MS, Overhead.split_at(2.0))
                       for k in (a, b))
    assert low * 0.999 <= noisy.overhead(2)(2) <= high * 1.001
    assert agreeing.overhead(2)(2) == pytest.approx((low + high) / 2, rel=1e-6)


def test_interrupted_search_resumes_without_measuring_twice(tmp_path):
    identity = {"model": "synthetic", "slo_ms": SLO_MS}
    path = tmp_path / "checkpoint.json"
    full = SyntheticServer()
    expected = search(Checkpoint(None, identity).replaying(full))
    total = len(full.calls)
    assert total > 4

    first = SyntheticServer(fail_after=4)
    with pytest.raises(KeyboardInterrupt):
        search(Checkpoint(path, identity).replaying(first))
    saved = json.loads(path.read_text())
    assert len(saved["points"]) == 4  # every measurement saved as soon as it was taken

    second = SyntheticServer()
    checkpoint = Checkpoint(path, identity)
    assert checkpoint.resumed
    resumed = search(checkpoint.replaying(second))
    assert len(second.calls) == total - 4 and checkpoint.replayed == 4
    assert second.calls == full.calls[4:]
    assert resumed.chosen.candidate == expected.chosen.candidate
    # The same path, point for point (only the resumed run's new server start is extra time).
    walk = lambda result: [(r.candidate, [(p.rate_rps, p.achieved_rps, p.p99_ms) for p in r.points])  # noqa: E731
                           for r in result.results]
    assert walk(resumed) == walk(expected)


def test_checkpoint_of_another_run_is_refused(tmp_path):
    path = tmp_path / "checkpoint.json"
    Checkpoint(path, {"model": "a"}).put("x", 1)
    with pytest.raises(CheckpointError, match="another tuning run"):
        Checkpoint(path, {"model": "b"})
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        Checkpoint(path, {"model": "a"})


def point(rate: float, capacity: float, p99_at_capacity: float = 200.0) -> Point:
    served = min(rate, capacity)
    p99 = 20.0 + p99_at_capacity * (rate / capacity) ** 4
    return Point("x", rate, rate, served, p99 / 2, p99, 0, seconds=1.0)


def test_find_max_rate_brackets_to_the_resolution():
    # p99 = 100 ms at rate = capacity * (80/200)^(1/4) ~ 0.795 capacity
    found = find_max_rate(lambda r: point(r, 100.0), 50.0, SLO_MS, RateSettings(resolution=1.05, max_points=12))
    assert 0.795 / 1.05 <= found.best.rate_rps / 100.0 <= 0.796
    rates = [p.rate_rps for p in found.points]
    assert rates[:3] == pytest.approx([50.0, 62.5, 78.125])  # p99 near the SLO: small steps


def test_find_max_rate_gallops_from_far_below():
    found = find_max_rate(lambda r: point(r, 1000.0), 10.0, SLO_MS, RateSettings(max_points=12))
    rates = [p.rate_rps for p in found.points]
    assert rates[:4] == pytest.approx([10.0, 12.5, 12.5 * 1.25 ** 2, 12.5 * 1.25 ** 2 * 1.25 ** 3])
    assert 0.795 / 1.06 <= found.best.rate_rps / 1000.0 <= 0.796


def test_find_max_rate_jumps_below_an_overloaded_start():
    found = find_max_rate(lambda r: point(r, 100.0), 1000.0, SLO_MS, RateSettings(max_points=8))
    assert found.points[1].rate_rps == pytest.approx(95.0)  # 0.95 x what the overloaded server served
    assert found.best is not None
    nothing = find_max_rate(lambda r: point(r, 1.0, 1e6), 10.0, SLO_MS, GRID_RATES)
    assert nothing.best is None


def test_service_fit_and_batching_simulation():
    fit = LinearServiceTime.fit([(1, 12.0), (2, 16.0), (4, 24.0), (8, 40.0)])
    assert (fit.a_ms, fit.c_ms) == (pytest.approx(8.0), pytest.approx(4.0))
    through_origin = LinearServiceTime.fit([(1, 9.0), (2, 21.0), (4, 41.0)])
    assert through_origin.a_ms == 0.0 and through_origin.c_ms > 0
    service = lambda b: 5.0 + 5.0 * b  # noqa: E731
    # A delay only fills batches when rate x delay reaches the batch size...
    slow = simulate(service, 1, 8, 20.0, rate_rps=50.0)  # 1 request per 20 ms: ~2 per batch
    busy = simulate(service, 1, 8, 20.0, rate_rps=170.0)  # near capacity: the queue fills them
    assert slow.mean_batch < 3.5 and busy.mean_batch > 6.0
    # ...and it is waited out in full at low load.
    assert simulate(service, 1, 8, 50.0, rate_rps=5.0).p99_ms > 50.0
    assert simulate(service, 1, 1, 50.0, rate_rps=5.0).p99_ms < 25.0  # s(1) 10 ms, x2 when two arrive close
    # Batch delay 0: TorchServe stops after one extra request.
    assert simulate(service, 1, 8, 0.0, rate_rps=170.0).mean_batch <= 2.0
    prediction = max_rate_within(service, Candidate(1, 1, 8, 2), SLO_MS)
    assert 0 < prediction.rate_rps < prediction.capacity_rps


def test_space_respects_the_cores():
    space = preset("full", cores=2)
    candidates = space.candidates()
    assert all(c.workers * c.threads <= 2 for c in candidates)
    assert {(c.workers, c.threads) for c in candidates} == {(1, 2), (2, 1)}
    assert sum(1 for c in candidates if c.batch_size == 1) == 2  # batch 1: no delay to tune
    assert len({c.behaviour for c in candidates}) == len(candidates)
    with pytest.raises(TuneError, match="cores"):
        Space(cores=2, workers=(3,), batch_sizes=(1,), delays_ms=(1,))
    with pytest.raises(TuneError, match="delay 0"):
        Space(cores=2, workers=(1,), batch_sizes=(4,), delays_ms=(0,))
    assert torchserve_defaults(2).settings().to_json()["maxBatchDelay"] == 100


def measured(candidate: Candidate, rps: float) -> CandidateResult:
    best = Point(candidate.key, rps, rps, rps, 10.0, 40.0, 0, seconds=1.0)
    return CandidateResult(candidate, "search", (best,), best, rps)


def test_a_shorter_delay_within_the_tie_wins():
    long_wait, short_wait = measured(Candidate(2, 1, 4, 5), 470.0), measured(Candidate(2, 1, 4, 1), 440.0)
    batch_one = measured(Candidate(2, 1, 1, 1), 300.0)  # no wait at all, but far below
    assert preferred([long_wait, short_wait, batch_one], tie_pct=10.0) is short_wait
    assert preferred([long_wait, short_wait, batch_one], tie_pct=5.0) is long_wait  # 6.4% slower: out of the tie
    # Every millisecond counts: delay 1 beats delay 2 within the tie, however close.
    two = measured(Candidate(2, 1, 8, 2), 460.0)
    assert preferred([long_wait, short_wait, two], tie_pct=10.0) is short_wait
    # Batch 1 never waits: within the tie it beats any delay.
    assert preferred([long_wait, short_wait, measured(Candidate(2, 1, 1, 1), 430.0)], 10.0).candidate.batch_size == 1
    assert preferred([], tie_pct=10.0) is None


def test_shorter_delay_measures_the_chosen_candidate_at_the_shortest_delay():
    space = Space(cores=2, workers=(2,), batch_sizes=(1, 4), delays_ms=(1, 5, 30))
    chosen = measured(Candidate(2, 1, 4, 30), 90.0)
    result = SearchResult((chosen,), chosen, "done", FITTED, (), ())
    server = SyntheticServer(overheads)
    trimmed = shorter_delay(result, space, server, SLO_MS, SearchSettings(), quiet)
    assert {key for key, _ in server.calls} == {"w2-t1-b4-d1"}  # only the shorter delay was measured
    assert trimmed.results[0] is chosen and trimmed.results[-1].phase == "delay"
    # The synthetic server serves ~85 req/s at delay 1: within 10% of 90, and it waits less.
    assert trimmed.chosen.candidate == Candidate(2, 1, 4, 1)
    # Measured already, or nothing shorter in the space: no new point.
    again = SyntheticServer(overheads)
    assert shorter_delay(trimmed, space, again, SLO_MS, SearchSettings(), quiet).chosen == trimmed.chosen
    assert again.calls == []


def test_verification_records_the_highest_passing_rate():
    from benchmarks.tune.verify import Verification

    def at(rate, p99):
        return Point("w2-t1-b4-d1", rate, rate, rate, 10.0, p99, 0, seconds=1.0)

    points = (at(100.0, 30.0), at(110.0, 45.0), at(121.0, 70.0), at(115.0, 48.0))
    checked = Verification("config.properties", {}, (), (1, 1), points, 50.0, 1.0)
    assert checked.confirmed.rate_rps == 115.0 and checked.passed
    assert checked.summary() == "verified from the written file"
    failed = Verification("config.properties", {}, (), (1, 1), points[2:3], 50.0, 1.0)
    assert not failed.passed and "FAILED" in failed.summary() and "121.0" in failed.summary()


class Clocked(SyntheticServer):
    """The synthetic server on a clock of its own: each measured point moves it by its seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def measure(self, phase: str, candidate: Candidate, rate: float) -> Point:
        measured = super().measure(phase, candidate, rate)
        self.now += measured.seconds + measured.overhead_s
        return measured


def test_a_time_budget_stops_the_search_before_a_candidate_that_does_not_fit():
    from benchmarks.load.budget import Budget

    clocked = Clocked()
    budget = Budget(100.0, clock=clocked.clock)
    strategy = ModelGuided(SPACE.candidates(), FITTED, SLO_MS, SearchSettings(), (), progress=quiet)
    searched = run(strategy, clocked, SLO_MS, quiet, budget)
    assert 1 <= len(searched.results) < len(search(SyntheticServer()).results)
    assert searched.stop_reason.startswith("time budget of 1.66667 min spent")
    assert budget.to_json()["left_out"], "the candidate not measured is named"
    assert strategy.result(searched).chosen is not None  # the best of those measured is still chosen


def test_a_time_budget_stops_a_candidates_rate_search_between_its_points():
    """A candidate does not run its whole rate search past the budget: the point that would not end
    within it (as long as the candidate's longest so far) is not measured, and the candidate keeps the
    points measured until then."""
    from benchmarks.load.budget import Budget

    clocked = Clocked()
    candidate = SPACE.candidates()[0]
    whole = evaluate(candidate, 20.0, SLO_MS, SyntheticServer(), "p", RateSettings())
    budget = Budget(60.0, clock=clocked.clock)
    cut = evaluate(candidate, 20.0, SLO_MS, clocked, "p", RateSettings(), budget=budget)
    assert len(whole.points) > 3
    assert len(cut.points) == 3 and clocked.now <= 60.0, (len(cut.points), clocked.now)  # 25 s, then 10 s each
    assert [p.rate_rps for p in cut.points] == [p.rate_rps for p in whole.points[:3]]
    assert budget.to_json()["left_out"][0].startswith(f"p {candidate.label} at ")
    best = max((p for p in cut.points if p.stable and p.passes(SLO_MS)), key=lambda p: p.rate_rps, default=None)
    assert cut.best == best
