"""A short end-to-end tune on a tiny space against real TorchServes, through the CLI.

It writes into a temp copy of config.properties (never the real root file), checks that only the
models= stanza and its provenance changed, that the verification server read the written values
back (GET /models/<name>), that the report folder is complete, and that --resume replays the run
without measuring again. The SLO is generous: on 2 shared cores this checks the mechanics, not
the numbers (those live in the committed tuner reports).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.tune.config_writer import find_stanza
from serving import properties
from serving.repo import DEFAULT_CONFIG, REPO_ROOT
from serving.ts_config import ServerConfig
from tests.e2e.conftest import MODELS

# slow: make test-all runs it; make test keeps the mix tune's smoke (test_tune_mix_smoke.py), the same
# writer, verification and report on two models at once.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = MODELS[-1]
TIMEOUT_S = 420


def run_tune(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks", "tune", *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def outside_stanza(text: str) -> list:
    """The lines outside the models= stanza, less the provenance and the load_models line (the fit may
    choose a variant archive; test_only_the_stanza_and_provenance_changed checks that line item by item)."""
    lines = text.splitlines()
    first, end = find_stanza(text.splitlines(keepends=True))
    return [line for line in lines[:first] + lines[end:]
            if not line.startswith(("# tuned ", "#   ", "# Tuner ", "load_models="))]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, model_store):
    tmp = tmp_path_factory.mktemp("tune")
    root_before = (DEFAULT_CONFIG).read_bytes()
    config = tmp / "config.properties"
    config.write_bytes(root_before)
    # Short windows next to the load generator on two cores vary more than the stability rule allows
    # real points (an unstable point sets no capacity; the verification's 5 s windows' p99 swings 3x
    # here): the smoke checks the pipeline, at loose rules; the rules themselves have their unit tests.
    # Two workers x one thread (robust next to other jobs), batch 1 or 4: TorchServe's defaults
    # (2 workers, batch 1) cover the first, the search measures at most the second.
    # The verification starts at the search's rate, which is at the capacity: three points let it step
    # down twice when the host is busier than during the search, or confirm a step up when it is not
    # (its points are the benchmark's 5 s windows: every one more costs ~20 s).
    done = run_tune("--model", MODEL, "--space", "tiny", "--workers", "2", "--batch-sizes", "1,4", "--delays", "5",
                    "--slo-ms", "1000", "--config", str(config), "--model-store", str(model_store),
                    "--out", str(tmp / "reports"), "--window-s", "1", "--max-windows", "2", "--stable-windows", "1",
                    "--stability-pct", "50", "--verify-stability-pct", "100",
                    "--warmup-s", "1", "--point-requests", "0", "--verify-points", "3", "--verify-warmup-s", "1",
                    "--fit-seconds", "0.5", "--max-candidates", "1", "--max-points", "3")
    assert done.returncode == 0, f"tune exited {done.returncode}\n{done.stdout}\n{done.stderr[-6000:]}"
    assert (DEFAULT_CONFIG).read_bytes() == root_before, "the real root config.properties changed"
    folders = list((tmp / "reports").iterdir())
    assert len(folders) == 1 and folders[0].name.startswith(f"tune-{MODEL}-")
    return {"done": done, "config": config, "original": root_before.decode(), "folder": folders[0],
            "report": json.loads((folders[0] / "report.json").read_text()),
            "model_store": model_store}


def test_report_folder_is_complete(tuned):
    folder = tuned["folder"]
    for name in ("report.json", "results.csv", "report.md", "candidates.png", "checkpoint.json"):
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name
    assert (folder / "candidates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = tuned["report"]
    assert report["search"][0]["phase"] == "defaults"  # measured first, the search's first calibration point
    assert report["chosen"]["key"] in {r["key"] for r in report["search"]}
    for result in report["search"]:
        c = result["candidate"]
        assert c["workers"] * c["threads"] <= report["space"]["cores"]
        assert result["points"] and all(p["achieved_rps"] <= p["offered_rps"] * 1.5 for p in result["points"])
    assert report["fit"]["points"] and report["timing"]["tuner_s"] > 0
    assert "Before / after" in (folder / "report.md").read_text()
    assert "report:" in tuned["done"].stdout


def test_only_the_stanza_and_provenance_changed(tuned):
    written = tuned["config"].read_text()
    assert outside_stanza(written) == outside_stanza(tuned["original"])
    chosen = tuned["report"]["chosen"]["candidate"]
    settings = ServerConfig.load(tuned["config"]).model(MODEL).settings
    assert (settings.batch_size, settings.max_batch_delay_ms, settings.min_workers, settings.max_workers) == (
        chosen["batch_size"], chosen["max_batch_delay_ms"], chosen["workers"], chosen["workers"])
    before = properties.parse(tuned["original"])
    after = properties.parse(written)
    rewritten = {"models", "load_models"}
    assert ({k: v for k, v in before.items() if k not in rewritten}
            == {k: v for k, v in after.items() if k not in rewritten})
    models_before, models_after = json.loads(before["models"]), json.loads(after["models"])
    for other in set(models_before) - {MODEL}:
        assert models_after[other] == models_before[other], other  # the other models untouched
    # load_models: the other models' items as they were; the tuned one's is the variant the fit chose.
    items_before = dict(item.split("=", 1) for item in before["load_models"].split(","))
    items_after = dict(item.split("=", 1) for item in after["load_models"].split(","))
    assert items_after.keys() == items_before.keys()
    assert {m: a for m, a in items_after.items() if m != MODEL} == {m: a for m, a in items_before.items() if m != MODEL}
    version = next(iter(models_after[MODEL]))
    assert items_after[MODEL] == models_after[MODEL][version]["marName"], (items_after[MODEL], tuned["report"]["variant"])
    assert f"# tuned {MODEL}: " in written and tuned["folder"].name in written


def test_verification_read_the_written_values_and_passed(tuned):
    verification = tuned["report"]["verification"]
    assert verification is not None and verification["mismatches"] == []
    chosen = tuned["report"]["chosen"]["candidate"]
    described = verification["described"]
    assert (described["batchSize"], described["maxBatchDelay"], described["minWorkers"]) == (
        chosen["batch_size"], chosen["max_batch_delay_ms"], chosen["workers"])
    # Every worker logged its thread count, and it is the candidate's.
    assert len(verification["worker_threads"]) == chosen["workers"]
    assert set(verification["worker_threads"]) == {chosen["threads"]}
    assert verification["points"] and verification["points"][0]["rate_rps"] > 0
    assert verification["passed"] is True, verification["summary"]


def test_resume_replays_without_measuring(tuned):
    done = run_tune("--resume", str(tuned["folder"]))
    assert done.returncode == 0, done.stderr[-4000:]
    assert "resuming" in done.stderr
    # Nothing measured again: no server started, no in-process fit, the verification replayed.
    assert "starting TorchServe" not in done.stderr and "in-process:" not in done.stderr
    assert "verification replayed from the checkpoint" in done.stderr
    again = json.loads((tuned["folder"] / "report.json").read_text())
    assert again["chosen"] == tuned["report"]["chosen"]
    assert again["search"] == tuned["report"]["search"]
