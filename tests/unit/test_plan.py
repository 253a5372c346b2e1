"""The worker's thread plan: the configuration its frontend read (handlers/frontend.py), the
threads written there and the loaded models' workers (handlers/plan.py)."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import MappingProxyType

import pytest

from handlers import frontend, plan
from handlers.errors import ConfigError
from handlers.frontend import ConfigSource, Frontend, locate

pytestmark = pytest.mark.unit

STANZA = ('models={\\\n  "minilm": {"1.0": {"minWorkers": 1, "maxWorkers": 1, "batchSize": 6, "threads": %s}},\\\n'
          '  "digits": {"1.0": {"minWorkers": 1, "maxWorkers": 1}},\\\n'
          '  "co2": {"1.0": {"defaultVersion": true, "minWorkers": 2, "maxWorkers": 2}}\\\n  }\n')
LOADS = "load_models=minilm=minilm.mar,digits=digits.mar,co2=co2.mar\n"


def write_config(folder: Path, threads="1", extra="", name="config.properties") -> Path:
    path = folder / name
    path.write_text("# a comment\ninference_address=http://127.0.0.1:8080\n" + LOADS + extra + STANZA % threads,
                    encoding="utf-8")
    return path


def a_frontend(cwd: Path, args=("-s", "model_store"), jvm=(), environ=None, started=None) -> Frontend:
    return Frontend(pid=1, cwd=cwd, jvm_args=tuple(jvm), server_args=("--python", sys.executable, *args),
                    environ=MappingProxyType(environ or {}), started=time.time() if started is None else started)


def write_snapshot(folder: Path, stamp: str, models_line: str, snapshot: dict, age_s: float = 60.0) -> Path:
    """A snapshot as TorchServe's Properties.store writes it: ':' and '=' escaped, one line per key."""
    escaped = models_line.replace(":", "\\:").replace("=", "\\=")
    path = folder / "logs" / "config" / f"{stamp}-startup.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps(snapshot).replace(":", "\\:").replace("=", "\\=")
    path.write_text(f"#Saving snapshot\n#Tue Nov 24\nmodels={escaped}\nmodel_snapshot={body}\n", encoding="latin-1")
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


# ---- which file the frontend read ------------------------------------------------------------
def test_the_working_directory_file_when_nothing_names_one(tmp_path):
    write_config(tmp_path)
    source = locate(a_frontend(tmp_path))
    assert (source.how, source.path) == (frontend.FROM_WORKDIR, tmp_path / "config.properties")
    assert plan.planned_threads(source, "minilm", "1.0") == 1


def test_the_f_argument_relative_to_the_frontends_working_directory(tmp_path):
    (tmp_path / "conf").mkdir()
    write_config(tmp_path / "conf", threads="3", name="tuned.properties")
    write_config(tmp_path, threads="1")
    source = locate(a_frontend(tmp_path, args=("-f", "conf/tuned.properties", "-s", "model_store")))
    assert (source.how, source.path) == (frontend.FROM_ARGUMENT, tmp_path / "conf" / "tuned.properties")
    assert plan.planned_threads(source, "minilm", "1.0") == 3


def test_the_environment_variable_wins_over_the_f_argument(tmp_path):
    named = write_config(tmp_path, threads="2", name="env.properties")
    write_config(tmp_path, threads="3", name="arg.properties")
    source = locate(a_frontend(tmp_path, args=("-f", "arg.properties"), environ={frontend.CONFIG_ENV: str(named)}))
    assert (source.how, plan.planned_threads(source, "minilm", "1.0")) == (frontend.FROM_ENV, 2)


def test_the_snapshot_wins_over_the_working_directory_file(tmp_path):
    write_config(tmp_path, threads="1")
    models = '{"minilm": {"1.0": {"minWorkers": 1, "threads": 2}}}'
    older = write_snapshot(tmp_path, "20261101000000000", models.replace("2}", "3}"), {"models": {}}, age_s=120)
    newest = write_snapshot(tmp_path, "20261102000000000", models, {"models": {}}, age_s=60)
    source = locate(a_frontend(tmp_path))
    assert (source.how, source.path) == (frontend.FROM_SNAPSHOT, newest) and older != newest
    assert plan.planned_threads(source, "minilm", "1.0") == 2


def test_a_snapshot_written_after_the_frontend_started_is_its_own_not_the_one_it_read(tmp_path):
    write_config(tmp_path, threads="1")
    read = write_snapshot(tmp_path, "20261101000000000", '{"minilm": {"1.0": {"threads": 2}}}', {"models": {}},
                          age_s=120)
    write_snapshot(tmp_path, "20261102000000000", '{"minilm": {"1.0": {"threads": 3}}}', {"models": {}}, age_s=0)
    assert locate(a_frontend(tmp_path, started=time.time() - 60)).path == read


@pytest.mark.parametrize("args", [("-ncs",), ("--no-config-snapshot",), ("-f", "config.properties")])
def test_no_snapshot_with_ncs_or_a_named_file(tmp_path, args):
    write_config(tmp_path)
    write_snapshot(tmp_path, "20261101000000000", '{"minilm": {"1.0": {"threads": 2}}}', {"models": {}})
    source = locate(a_frontend(tmp_path, args=args))
    assert not source.is_snapshot and plan.planned_threads(source, "minilm", "1.0") == 1


def test_log_location_moves_the_snapshots(tmp_path):
    write_config(tmp_path)
    snap = write_snapshot(tmp_path / "elsewhere", "20261101000000000", '{"minilm": {"1.0": {"threads": 2}}}',
                          {"models": {}})
    assert locate(a_frontend(tmp_path, environ={"LOG_LOCATION": "elsewhere/logs"})).path == snap
    assert locate(a_frontend(tmp_path, jvm=["-DLOG_LOCATION=elsewhere/logs"])).path == snap


def test_ts_config_file_property_renames_the_default(tmp_path):
    write_config(tmp_path, threads="4", name="other.properties")
    source = locate(a_frontend(tmp_path, jvm=["-DtsConfigFile=other.properties"]))
    assert plan.planned_threads(source, "minilm", "1.0") == 4


def test_no_file_is_no_plan(tmp_path):
    source = locate(a_frontend(tmp_path))
    assert source.how == frontend.NO_FILE and plan.planned_threads(source, "minilm", "1.0") is None


def test_a_real_child_finds_its_frontend_through_proc(tmp_path):
    """A parent whose command line names TorchServe's main class; the child reads it as a worker does."""
    write_config(tmp_path, threads="3")
    child = textwrap.dedent("""
        from handlers import frontend, plan
        found = frontend.find_frontend()
        source = frontend.locate(found)
        print(found.cwd, source.how, plan.planned_threads(source, "minilm", "1.0"))
    """)
    parent = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {child!r}]))"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop(frontend.CONFIG_ENV, None)
    out = subprocess.run([sys.executable, "-c", parent, frontend.MAIN_CLASS, "-s", "model_store"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == [str(tmp_path), *frontend.FROM_WORKDIR.split(), "3"]


def test_outside_torchserve_there_is_no_frontend():
    assert frontend.find_frontend() is None


# ---- the plan and the workers ------------------------------------------------------------------
def source_of(tmp_path, threads="1", extra="", args=("-s", "model_store")) -> ConfigSource:
    write_config(tmp_path, threads=threads, extra=extra)
    return locate(a_frontend(tmp_path, args=args))


@pytest.mark.parametrize("model, version", [("digits", "1.0"), ("minilm", "2.0"), ("unknown", "1.0")])
def test_no_plan_for_a_model_without_threads(tmp_path, model, version):
    assert plan.planned_threads(source_of(tmp_path), model, version) is None


def test_no_source_no_plan():
    assert plan.planned_threads(None, "minilm", "1.0") is None


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", '"2"', "true"])
def test_a_bad_plan_is_an_error_naming_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"models\.minilm\.1\.0\.threads"):
        plan.planned_threads(source_of(tmp_path, bad), "minilm", "1.0")


def test_workers_of_every_loaded_model(tmp_path):
    loaded = plan.loaded_workers(source_of(tmp_path), "minilm")
    assert dict(loaded.per_model) == {"minilm": 1, "digits": 1, "co2": 2} and loaded.total == 4


def test_an_archives_own_min_workers_counts_for_its_model(tmp_path):
    assert plan.loaded_workers(source_of(tmp_path), "minilm", own_workers=3).total == 6


def test_a_model_without_an_entry_gets_the_default_workers(tmp_path):
    source = source_of(tmp_path, extra="default_workers_per_model=2\nload_models=minilm.mar,other=o.mar\n")
    assert dict(plan.loaded_workers(source, "minilm").per_model) == {"minilm": 1, "other": 2}


def test_the_models_argument_overrides_load_models(tmp_path):
    source = source_of(tmp_path, args=("-s", "model_store", "-m", "digits=digits.mar", "co2=co2.mar", "-ncs"))
    assert dict(plan.loaded_workers(source, "digits").per_model) == {"digits": 1, "co2": 2}


@pytest.mark.parametrize("load", ["all", "ALL", ""])
def test_loading_all_leaves_the_count_unknown(tmp_path, load):
    loaded = plan.loaded_workers(source_of(tmp_path, extra=f"load_models={load}\n"), "minilm")
    assert loaded.total is None and "load_models" in loaded.unknown


def test_a_snapshot_counts_its_restored_models(tmp_path):
    snapshot = {"models": {"minilm": {"1.0": {"minWorkers": 1}}, "co2": {"1.0": {"minWorkers": 2}}}}
    write_snapshot(tmp_path, "20261101000000000", '{"minilm": {"1.0": {"threads": 1}}}', snapshot)
    assert plan.loaded_workers(locate(a_frontend(tmp_path)), "minilm").total == 3


def test_a_snapshot_that_differs_from_config_properties_is_named_loudly(tmp_path):
    write_config(tmp_path, threads="1")
    write_snapshot(tmp_path, "20261101000000000", '{"minilm": {"1.0": {"threads": 2}}}', {"models": {}})
    warning = plan.snapshot_warning(locate(a_frontend(tmp_path)))
    assert warning and "differ from" in warning and "--ncs" in warning and "logs/config" in warning


def test_a_snapshot_that_matches_config_properties_is_quiet(tmp_path):
    text = write_config(tmp_path, threads="1").read_text()
    models = next(line for line in plan.properties.parse(text).items() if line[0] == "models")[1]
    write_snapshot(tmp_path, "20261101000000000", models, {"models": {}})
    source = locate(a_frontend(tmp_path))
    assert source.is_snapshot and plan.snapshot_warning(source) is None
    assert plan.snapshot_warning(locate(a_frontend(tmp_path, args=("-ncs",)))) is None


@pytest.mark.parametrize("extra, gpus, per_model", [
    ("", 13, 13),  # TorchServe: one worker per GPU when default_workers_per_model is unset
    ("number_of_gpu=1\n", 13, 1),  # number_of_gpu caps the GPUs it uses
    ("number_of_gpu=0\n", 13, None),  # no GPU: one per CPU
    ("", 0, None),
    ("default_workers_per_model=3\n", 13, 3),  # the setting wins
])
def test_default_workers_follow_torchserve_on_a_gpu_host(tmp_path, extra, gpus, per_model, monkeypatch):
    import os

    monkeypatch.setattr(plan, "visible_gpus", lambda: gpus)
    source = source_of(tmp_path, extra=extra + "load_models=other=o.mar\n")
    assert plan.loaded_workers(source, "other").per_model["other"] == (per_model or os.cpu_count())
