"""Tuning for a traffic mix, without a server: the mix, its points, the core budget, the search
(against a synthetic server) and the written file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from benchmarks.load.capacity import RateSettings, find_max_rate
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.loadgen import Payload
from benchmarks.load.mix import NORMALISED_SLO, Mix, MixPoint, mixed_payloads
from benchmarks.tune.config_writer import Update
from benchmarks.tune.errors import TuneError
from benchmarks.tune.mix.measure import Capacity
from benchmarks.tune.mix.pipeline import first_rate
from benchmarks.tune.mix.plan import MixPlan, apportion, neighbours, starting_plan
from benchmarks.tune.mix.search import SearchSettings, bottleneck_order, search
from benchmarks.tune.mix.writer import rewrite_mix
from benchmarks.tune.space import Candidate
from serving import properties
from serving.mix_record import MixRecord, ModelShare, read_mix
from serving.ts_config import ModelSettings, parse_models

pytestmark = pytest.mark.unit

SLO = {"text": 50.0, "image": 100.0, "idle": 50.0}
MIX = Mix.parse("text=0.7,image=0.3", SLO)


def test_parse_normalises_weights_and_keeps_each_models_slo():
    mix = Mix.parse("text=7, image=3", SLO)
    assert mix.shares == {"text": pytest.approx(0.7), "image": pytest.approx(0.3)}
    assert mix.slo_ms == {"text": 50.0, "image": 100.0}


@pytest.mark.parametrize("text, fix", [("text=0.7,nope=0.3", "not in the catalogue"), ("text", "<model>=<share>"),
                                       ("text=-1", "<model>=<share>"), ("text=1,text=2", "named twice"),
                                       ("", "no model given"), ("text=abc", "<model>=<share>")])
def test_parse_errors_name_the_fix(text, fix):
    with pytest.raises(BenchmarkError, match=fix):
        Mix.parse(text, SLO)


def test_mixed_payloads_hold_the_shares_and_go_to_each_model():
    own = {"text": [Payload(b"t", "text/plain")], "image": [Payload(b"i1", "image/jpeg"), Payload(b"i2", "image/jpeg")]}
    sequence = mixed_payloads(MIX, own)
    assert Counter(p.tag for p in sequence) == {"text": 700, "image": 300}
    assert {p.path for p in sequence if p.tag == "image"} == {"/predictions/image"}
    assert {p.body for p in sequence if p.tag == "image"} == {b"i1", b"i2"}
    assert [p.tag for p in sequence[:20]] != sorted(p.tag for p in sequence[:20])  # shuffled, not blocks


def point(rate: float, p99: dict, served: float = 1.0, errors: dict | None = None) -> MixPoint:
    def figures(model):
        offered = rate * MIX.shares[model]
        return {"offered_rps": offered, "achieved_rps": offered * served, "requests": 1000, "unanswered": 0,
                "errors": (errors or {}).get(model, {}), "latency_ms": {"p99_ms": p99[model]}}
    return MixPoint(rate, rate, rate * served, {m: figures(m) for m in MIX.names}, MIX.slo_ms, 20.0)


def test_a_point_passes_only_when_every_model_is_within_its_own_target():
    assert point(100, {"text": 49, "image": 99}).passes()
    assert not point(100, {"text": 51, "image": 20}).passes()  # the text model alone misses
    assert not point(100, {"text": 10, "image": 101}).passes()
    assert not point(100, {"text": 10, "image": 20}, errors={"image": {"503": 2}}).passes()
    assert not point(100, {"text": 10, "image": 20}, served=0.9).passes()
    # The search sees the worst model's p99 as a fraction of its own target.
    assert point(100, {"text": 25, "image": 80}).p99_ms == pytest.approx(0.8)


def test_the_rate_search_finds_the_highest_rate_where_every_model_passes():
    def probe(rate):  # text misses above 230 req/s, image above 200
        return point(rate, {"text": 40 if rate <= 230 else 80, "image": 90 if rate <= 200 else 150})

    found = find_max_rate(probe, 100.0, NORMALISED_SLO, RateSettings(max_points=12))
    assert 190 <= found.best.rate_rps <= 200


@pytest.mark.parametrize("cores, demand, expected", [(2, {"a": 1, "b": 1}, {"a": 1, "b": 1}),
                                                     (8, {"a": 3, "b": 1}, {"a": 6, "b": 2}),
                                                     (4, {"a": 100, "b": 1}, {"a": 3, "b": 1})])
def test_cores_go_by_demand_at_least_one_each_within_the_budget(cores, demand, expected):
    assert apportion(cores, demand) == expected


def test_more_models_than_cores_is_an_error_naming_the_fix():
    with pytest.raises(TuneError, match="serve fewer models per server"):
        apportion(2, {"a": 1, "b": 1, "c": 1})


def test_starting_plan_shares_cores_by_demand_and_keeps_each_models_own_batch_and_delay():
    alone = {"text": (ModelSettings(batch_size=6, max_batch_delay_ms=1, min_workers=2, max_workers=2), 460.0),
             "image": (ModelSettings(batch_size=3, max_batch_delay_ms=2, min_workers=2, max_workers=2), 150.0)}
    assert starting_plan(MIX, 2, alone).by_model == {"text": Candidate(1, 1, 6, 1), "image": Candidate(1, 1, 3, 2)}
    # 8 cores: text needs 0.7 / 460 of a server, image 0.3 / 150: 3 cores to 5.
    assert starting_plan(MIX, 8, alone).by_model == {"text": Candidate(3, 1, 6, 1), "image": Candidate(5, 1, 3, 2)}


def test_no_neighbour_leaves_the_budget_and_idle_models_get_one_thread():
    plan = MixPlan((("text", Candidate(3, 1, 4, 2)), ("image", Candidate(1, 1, 2, 2))))
    moves = list(neighbours(plan, "image", 4, (1, 2, 4, 8), (1, 2, 5)))
    assert moves and all(m.cores <= 4 for m in moves)
    assert any(m.by_model["image"].workers == 2 and m.by_model["text"].workers == 2 for m in moves)  # a core moved
    assert {m.by_model["image"].batch_size for m in moves} == {1, 2, 4}
    settings = plan.settings({"idle": ModelSettings(batch_size=32, min_workers=2, max_workers=2, threads=2)})
    assert settings["idle"] == ModelSettings(batch_size=32, min_workers=1, max_workers=1, threads=1)
    assert settings["text"].threads == 1 and settings["text"].min_workers == 3


def synthetic_capacity(plan: MixPlan) -> Capacity:
    """A server where the image model's capacity grows with its batch up to 4, the text model's is ample."""
    image = plan.by_model["image"]
    limit = 100.0 * min(image.batch_size, 4) / 2

    def probe(rate):
        return point(rate, {"text": 30, "image": 90 if rate <= limit else 300})

    found = find_max_rate(probe, 50.0, NORMALISED_SLO, RateSettings(max_points=10))
    return Capacity("synthetic", found.points, found.best, {}, 0.0, 0.0)


def test_the_search_moves_the_bottleneck_model_and_stops_without_gain():
    start = MixPlan((("text", Candidate(1, 1, 6, 1)), ("image", Candidate(1, 1, 1, 2))))
    calls = []

    def measure(plan, rps, label):
        calls.append(plan)
        return synthetic_capacity(plan)

    first = synthetic_capacity(start)
    assert bottleneck_order(MIX, first)[0] == "image"
    tried, chosen = search(MIX, 2, start, 50.0, measure, SearchSettings(batch_sizes=(1, 2, 4, 8), delays=(1, 2),
                                                                          max_candidates=12), lambda _: None)
    assert chosen.plan.by_model["image"].batch_size == 4
    assert chosen.capacity.rate_rps >= 190
    assert len({t.plan.key for t in tried}) == len(tried)  # nothing measured twice
    assert len(tried) < 12  # it stopped by itself


CONFIG = """# the server
inference_address=http://127.0.0.1:8080
# tuned idle: 2026-11-22 22:37 UTC, SLO p99 <= 50 ms: batchSize 32, maxBatchDelay 1 ms, 1 worker x 2 threads
#   measured: 2630.1 req/s at p99 34.4 ms (verified)
#   report x; machine y
models={\\
  "text": {"1.0": {"defaultVersion": true, "marName": "text.mar", "minWorkers": 2, "maxWorkers": 2, "batchSize": 6}},\\
  "idle": {"1.0": {"defaultVersion": true, "marName": "idle.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": 32}}\\
  }
"""


def record(capacity: float) -> MixRecord:
    return MixRecord((ModelShare("text", 0.7, 50, 1, 1, 8, 2, 0.7 * capacity, 40.0),
                      ModelShare("image", 0.3, 100, 1, 1, 2, 1, 0.3 * capacity, 90.0)), capacity, 100.0, 2, 1800.0,
                     "2026-11-23 10:00 UTC", "benchmarks/reports/tune-mix-x", "machine")


def test_a_re_tune_starts_below_the_recorded_capacity_when_no_model_was_tuned_alone():
    never_alone = {"text": (ModelSettings(batch_size=6), None), "image": (ModelSettings(batch_size=3), None)}
    plan = starting_plan(MIX, 2, never_alone)
    assert first_rate(MIX, plan, 2, never_alone, record(250.0)) == 200.0
    assert first_rate(MIX, plan, 2, never_alone, None) == 20.0  # nothing known: start low
    other_mix = Mix.parse("text=1", SLO)  # a record of another mix says nothing of this one
    assert first_rate(other_mix, starting_plan(other_mix, 2, never_alone), 2, never_alone, record(250.0)) == 20.0
    alone = {"text": (ModelSettings(batch_size=6), 460.0), "image": (ModelSettings(batch_size=3), 150.0)}
    assert first_rate(MIX, plan, 2, alone, record(250.0)) == round(0.8 * 150.0 / 2 / 0.3, 1)  # alone figures first


def test_the_written_file_carries_threads_and_one_mix_record(tmp_path: Path):
    plan = MixPlan((("text", Candidate(1, 1, 8, 2)), ("image", Candidate(1, 1, 2, 1))))
    others = {"text": ModelSettings(batch_size=6, min_workers=2, max_workers=2),
              "idle": ModelSettings(batch_size=32, min_workers=1, max_workers=1)}
    updates = [Update(n, s, "1.0", f"{n}.mar") for n, s in plan.settings(others).items()]
    once = rewrite_mix(CONFIG, updates, (), record(250.0), ("idle",))
    twice = rewrite_mix(once, updates, (), record(260.0), ("idle",))  # a re-tune replaces, never stacks
    path = tmp_path / "config.properties"
    path.write_text(twice, encoding="utf-8")
    assert read_mix(path) == record(260.0)
    assert twice.count("# mix-record: ") == 1 and "250.0 req/s" not in twice
    assert "# tuned idle:" not in twice  # its record described values tuned alone
    written = {e.name: e.settings for e in parse_models(properties.parse(twice)["models"])}
    assert written["text"] == ModelSettings(batch_size=8, max_batch_delay_ms=2, threads=1)
    assert written["idle"].threads == 1 and written["idle"].batch_size == 32
    assert written["image"].threads == 1
    assert properties.parse(twice)["inference_address"] == "http://127.0.0.1:8080"


def test_a_file_without_a_mix_record_has_none(tmp_path: Path):
    path = tmp_path / "config.properties"
    path.write_text(CONFIG, encoding="utf-8")
    assert read_mix(path) is None


def test_alone_capacity_comes_from_a_per_model_tune_never_from_a_mix_share(tmp_path: Path):
    from benchmarks.tune.mix.pipeline import SHARE_NOTE, alone_values
    from serving.ts_config import ServerConfig

    lines = ["# tuned text: 2026-11-23 02:19 UTC, SLO p99 <= 50 ms: batchSize 6, maxBatchDelay 1 ms, 2 workers x 1 thread",
             "#   measured: 461.7 req/s at p99 41.8 ms (verified from the written file)",
             "# tuned idle: 2026-11-23 04:45 UTC, SLO p99 <= 50 ms: batchSize 6, maxBatchDelay 1 ms, 1 worker x 1 thread",
             f"#   measured: 155.6 req/s at p99 38.4 ms ({SHARE_NOTE}, 222.0 req/s in all: see the mix record above)"]
    text = "\n".join(lines) + "\n" + CONFIG.split("# the server\n", 1)[1].replace(
        "# tuned idle", "# was idle").replace("#   measured: 2630.1", "#   was")
    path = tmp_path / "config.properties"
    path.write_text(text, encoding="utf-8")
    alone = alone_values(text, ServerConfig.load(path), ("text", "idle"))
    assert alone["text"][1] == 461.7 and alone["idle"][1] is None


PLANNED = """inference_address=http://127.0.0.1:8080
load_models=text=text.mar,image=image.mar,idle=idle.mar
models={\\
  "text": {"1.0": {"defaultVersion": true, "marName": "text.mar", "minWorkers": 1, "maxWorkers": 1,\\
    "batchSize": 6, "maxBatchDelay": 1, "threads": 1}},\\
  "image": {"1.0": {"defaultVersion": true, "marName": "image.mar", "minWorkers": 1, "maxWorkers": 1,\\
    "batchSize": 3, "maxBatchDelay": 2, "threads": 1}},\\
  "idle": {"1.0": {"defaultVersion": true, "marName": "idle.mar", "minWorkers": 2, "maxWorkers": 2, "batchSize": 32, "threads": 1}}\\
  }
"""


def tune_with(tmp_path, monkeypatch, rates: dict[str, float], search_rate):
    """Runs the mix tuner on PLANNED with its servers faked: each long measurement's capacity by its
    label, each search candidate's by `search_rate(settings)`; returns (writes, report contents)."""
    from benchmarks.tune.mix import pipeline
    from benchmarks.tune.mix.measure import PointSettings

    config = tmp_path / "config.properties"
    config.write_text(PLANNED)

    def measure(label, mix, store, cfg, settings, start_rps, point_settings, progress):
        rate = rates.get(label) or search_rate(settings)
        return Capacity(label, (), point(rate, {"text": 30, "image": 90}), {}, 1000.0, 1.0)

    writes, reports = [], []
    monkeypatch.setattr(pipeline, "measure_capacity", measure)
    monkeypatch.setattr(pipeline, "build_entry", lambda *a, **k: None)
    monkeypatch.setattr(pipeline, "describe_environment", lambda: {})
    monkeypatch.setattr(pipeline, "write_mix", lambda path, updates, records, mix, idle, archives:
                        writes.append(({u.name: u.settings for u in updates}, mix)))
    monkeypatch.setattr(pipeline.report, "write", lambda folder, content: reports.append(content))
    monkeypatch.setattr(pipeline.report, "print_summary", lambda content, folder: None)
    options = pipeline.MixOptions(MIX, 2, config, tmp_path, tmp_path / "run",
                                  SearchSettings(batch_sizes=(3, 4), delays=(2,), max_candidates=2),
                                  PointSettings(), PointSettings(), True, "test")
    assert pipeline.tune_mix(options, lambda line: None) == 0
    return writes, reports


@pytest.mark.parametrize("tuned_rps, written_batch", [(190.0, 3), (260.0, 4)])
def test_the_search_choice_is_written_only_when_it_serves_more_than_the_values_before(
        tmp_path, monkeypatch, tuned_rps, written_batch):
    from benchmarks.tune.mix import pipeline

    rates = {"config.properties before": 230.0, "tuned (from the written file)": tuned_rps,
             "kept (from the written file)": 228.0}
    # The search's short points favour a bigger image batch; the long ones decide.
    writes, reports = tune_with(tmp_path, monkeypatch, rates,
                                lambda settings: 240.0 if settings["image"].batch_size == 4 else 200.0)
    written, record = writes[-1]
    assert written["image"].batch_size == written_batch
    assert written["idle"].min_workers == 1  # idle models: one worker of one thread either way
    assert record.capacity_rps == (228.0 if written_batch == 3 else tuned_rps) and record.baseline_rps == 230.0
    assert record.unchanged == (written_batch == 3)
    content = reports[-1]
    kept = written_batch == 3
    assert (content["rejected"] is not None) == kept
    assert ("The search's choice served less than the values before" in pipeline.report.markdown(content)) == kept


def test_a_tune_that_writes_the_values_before_again_claims_no_gain(tmp_path, monkeypatch):
    """The search's best is the start (the file's own values): the two long measurements are of the
    same values, so their ratio is spread; the record, the report and the target say so."""
    from benchmarks.tune.mix import pipeline

    rates = {"config.properties before": 150.0, "tuned (from the written file)": 240.0}
    writes, reports = tune_with(tmp_path, monkeypatch, rates,
                                lambda settings: 200.0 if settings["image"].batch_size == 3 else 120.0)
    (_, record), content = writes[-1], reports[-1]
    assert record.unchanged and content["unchanged"] and content["rejected"] is None
    assert content["ratio"] == 1.6 and not content["target"]["met"]  # 1.6x of the same values: spread
    assert "not a gain" in pipeline.report.markdown(content)
    assert "unchanged by this tune" in record.lines()[0]
    assert MixRecord.from_json(record.to_json()).unchanged
