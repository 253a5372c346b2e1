"""A short mix tune against real TorchServes, through the CLI: two models of the catalogue loaded
at once, mixed open-loop traffic, a one-candidate search, the reference, the write into a temp copy
of config.properties and the verification from it. The SLOs are the catalogue's and the points
tiny: this checks the mechanics (the numbers live in the committed tune-mix report)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serving import properties
from serving.mix_record import read_mix
from serving.repo import DEFAULT_CONFIG, REPO_ROOT
from serving.ts_config import parse_models

pytestmark = pytest.mark.e2e

MIX = "minilm=0.6,digits=0.4"
TIMEOUT_S = 900  # the run takes 2-3 min on an idle 2-core host; room for a busy, shared one


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, model_store):
    tmp = tmp_path_factory.mktemp("tune-mix")
    root_before = DEFAULT_CONFIG.read_bytes()
    config = tmp / "config.properties"
    config.write_bytes(root_before)
    command = [sys.executable, "-m", "benchmarks", "tune", "--mix", MIX, "--config", str(config),
               "--model-store", str(model_store), "--out", str(tmp / "reports"), "--mix-candidates", "1",
               "--mix-search-requests", "100", "--point-requests", "100", "--max-points", "2", "--mix-window-s", "1",
               "--mix-warmup-s", "1", "--verify-warmup-s", "1",
               # 1 s windows: the smoke checks the pipeline, not the stability rule
               "--stability-pct", "50", "--verify-stability-pct", "50"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert DEFAULT_CONFIG.read_bytes() == root_before, "the real root config.properties changed"
    assert (tmp / "reports").is_dir(), f"the mix tune wrote no report (exit {done.returncode}):\n{done.stderr[-3000:]}"
    folders = list((tmp / "reports").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith("tune-mix-"), folders
    return {"done": done, "config": config, "folder": folders[0]}


def test_the_run_writes_a_plan_within_the_core_budget_and_its_record(tuned):
    done = tuned["done"]
    assert done.returncode in (0, 1), f"tune exited {done.returncode}\n{done.stdout}\n{done.stderr[-6000:]}"
    record = read_mix(tuned["config"])
    assert record is not None and record.shares == pytest.approx({"minilm": 0.6, "digits": 0.4})
    written = {e.name: e.settings for e in parse_models(properties.parse(tuned["config"].read_text())["models"])}
    mixed = [written[m.name] for m in record.models]
    assert sum(s.min_workers * s.threads for s in mixed) <= record.cores
    assert all(written[n].threads is not None for n in written)  # every model, in the mix or idle
    for model in record.models:
        s = written[model.name]
        assert (s.batch_size, s.max_batch_delay_ms, s.min_workers, s.threads) == (
            model.batch_size, model.max_batch_delay_ms, model.workers, model.threads)


def test_the_report_compares_with_the_per_model_values_in_the_same_run(tuned):
    folder = tuned["folder"]
    for name in ("report.json", "report.md", "mix.png", "config.before.properties"):
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name
    report = json.loads((folder / "report.json").read_text())
    assert report["reference"]["points"] and report["verified"]["points"]
    verified = report["verified"]
    # The verification server read the written plan: every worker of the mix ran its planned threads.
    for name, plan in report["chosen"].items():
        assert set(verified["worker_threads"][name]) == {plan["threads"]}
    for point in verified["points"]:
        assert set(point["models"]) == {"minilm", "digits"}
        assert all(f["requests"] > 0 for f in point["models"].values())
    assert "Capacity in the mix" in (folder / "report.md").read_text()
