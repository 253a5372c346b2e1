"""One config that is true: the written plan against what it loads (serving/plan_check.py), as
`make serve` warns and as the tuner re-checks after it writes config.properties."""

from dataclasses import replace

import pytest

from benchmarks.tune.config_writer import Update, write_config
from serving.mix_record import read_mix
from serving.plan_check import plan_problems
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ModelEntry, ModelSettings, ServerConfig
from tests.mix_config import mix_record, write_mix_config

pytestmark = pytest.mark.unit

MIX = ("minilm", "efficientnet_lite0")


def config_with(tmp_path, record, extra=()):
    """The repository's file with the mix's values, plus `extra` models= entries (name, workers, threads)."""
    path = write_mix_config(DEFAULT_CONFIG, tmp_path / "config.properties", record)
    if extra:
        updates = [Update(n, ModelSettings(batch_size=8, max_batch_delay_ms=1, min_workers=w, max_workers=w,
                                           threads=t)) for n, w, t in extra]
        write_config(path, updates)
    return ServerConfig.load(path)


def test_a_true_plan_has_nothing_to_say(tmp_path):
    record = replace(mix_record(), loaded=MIX)
    assert plan_problems(config_with(tmp_path, record), list(MIX), record, cores=2) == []


def test_a_model_loaded_since_the_record_makes_it_another_servers_figure(tmp_path):
    record = replace(mix_record(), loaded=MIX)
    config = config_with(tmp_path, record, extra=[("co2", 1, 1)])
    (problem,) = plan_problems(config, [*MIX, "co2"], record, cores=2)
    assert "loaded now but not then: co2" in problem and "make tune MIX=" in problem


def test_a_record_that_does_not_say_what_was_loaded_is_named(tmp_path):
    record = mix_record()
    problems = plan_problems(config_with(tmp_path, record), list(MIX), record, cores=2)
    assert problems and "does not say which models were loaded" in problems[0]


def test_a_model_retuned_alone_after_the_mix_is_named_and_so_is_a_busy_idle_model(tmp_path):
    record = replace(mix_record(), loaded=(*MIX, "co2"))
    config = config_with(tmp_path, record, extra=[("minilm", 2, 1), ("co2", 2, 1)])
    problems = plan_problems(config, [*MIX, "co2"], record, cores=2)
    assert any(p.startswith("minilm differs from the mix record (minWorkers=2") for p in problems), problems
    assert any(p.startswith("co2 is outside the mix but planned for 2 threads") for p in problems), problems
    assert any("runs 3 intra-op threads" in p for p in problems), problems


def test_without_a_record_every_loaded_models_threads_count_against_the_cores(tmp_path):
    config = ServerConfig.load(DEFAULT_CONFIG)
    entries = {e.name: e for e in config.models}
    loaded = [n for n in entries]
    total = sum(e.settings.min_workers * (e.settings.threads or 1) for e in entries.values())
    problems = plan_problems(config, loaded, None, cores=total - 1)
    assert len(problems) == 1 and f"runs {total} intra-op threads" in problems[0]
    assert plan_problems(config, loaded, None, cores=total) == []


def test_the_tuner_warns_after_writing_a_plan_that_no_longer_holds(tmp_path, capsys):
    record = replace(mix_record(), loaded=MIX)
    config = config_with(tmp_path, record)
    write_config(config.path, [Update("minilm", ModelSettings(batch_size=4, max_batch_delay_ms=1, min_workers=2,
                                                              max_workers=2, threads=1))])
    assert "[tune] warning: config.properties: minilm differs from the mix record" in capsys.readouterr().err


def test_an_entry_without_threads_counts_one_per_worker():
    from serving.plan_check import planned_threads

    assert planned_threads(ModelEntry("m", ModelSettings(min_workers=3, max_workers=3))) == 3


def test_the_shipped_config_passes_its_own_check(tmp_path):
    config = ServerConfig.load(DEFAULT_CONFIG)
    loaded = list(config.startup_archives(tmp_path))  # load_models names its archives: no store needed
    record = read_mix(DEFAULT_CONFIG)
    assert record is not None and set(record.loaded) == set(loaded)  # measured with what it loads
    assert plan_problems(config, loaded, record, cores=record.cores) == []
