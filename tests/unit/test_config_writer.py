"""The tuner's config.properties writer: only the models= stanza and the provenance records change;
archives that would override config.properties make it refuse."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from benchmarks.tune.config_writer import (
    HEADER,
    Provenance,
    Update,
    check_archives,
    find_stanza,
    rewrite,
    snapshot_folder,
    write_config,
)
from benchmarks.tune.errors import ConfigWriteError
from serving import properties
from serving.repo import DEFAULT_CONFIG
from serving.ts_config import ModelSettings, ServerConfig

pytestmark = pytest.mark.unit


SAMPLE = """\
# A hand-written config, comments and odd spacing included.
inference_address=http://127.0.0.1:8080
metrics_mode = prometheus

# Per-model values (kept comment).
models={\\
  "efficientnet_lite0": {"1.0": {"defaultVersion": true, "marName": "efficientnet_lite0.mar",\\
    "minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 20, "responseTimeout": 120,\\
    "jobQueueSize": 7}},\\
  "minilm": {"1.0": {"defaultVersion": true, "marName": "minilm.mar",\\
    "minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 10, "responseTimeout": 120}}\\
  }
# trailing comment
job_queue_size=100
"""

TUNED = ModelSettings(batch_size=4, max_batch_delay_ms=3, min_workers=2, max_workers=2)


def record(model: str, rps: float = 123.4) -> Provenance:
    return Provenance(model=model, date="2026-11-21 07:12 UTC", slo_ms=50, settings=TUNED, threads=1,
                      throughput_rps=rps, p99_ms=45.6, verified="verified", defaults_rps=60.1,
                      report=f"benchmarks/reports/tune-{model}-x", machine="AMD EPYC, 2 cores")


def outside(text: str) -> list:
    """The lines that are neither the models= stanza nor provenance records."""
    lines = text.splitlines(keepends=True)
    first, end = find_stanza(lines)
    kept = lines[:first] + lines[end:]
    return [line for line in kept if not line.startswith(("# tuned ", "#   ")) and line.rstrip() != HEADER]


def models_of(text: str) -> dict:
    return json.loads(properties.parse(text)["models"])


def test_round_trip_changes_only_the_tuned_model():
    new = rewrite(SAMPLE, [Update("minilm", TUNED)], [record("minilm")])
    assert outside(new) == outside(SAMPLE)  # every other line and comment, byte for byte
    before, after = models_of(SAMPLE), models_of(new)
    assert after["efficientnet_lite0"] == before["efficientnet_lite0"]  # untouched, extra key kept
    assert after["efficientnet_lite0"]["1.0"]["jobQueueSize"] == 7
    entry = after["minilm"]["1.0"]
    assert (entry["batchSize"], entry["maxBatchDelay"], entry["minWorkers"], entry["maxWorkers"]) == (4, 3, 2, 2)
    assert entry["marName"] == "minilm.mar" and entry["defaultVersion"] is True
    assert list(entry) == list(before["minilm"]["1.0"])  # key order kept


def test_written_file_reads_back_through_server_config(tmp_path):
    path = tmp_path / "config.properties"
    path.write_text(SAMPLE)
    write_config(path, [Update("minilm", TUNED)], [record("minilm")])
    assert ServerConfig.load(path).model("minilm").settings == TUNED
    assert ServerConfig.load(path).get("job_queue_size") == "100"


def test_provenance_sits_above_the_stanza_and_is_replaced_on_retune():
    once = rewrite(SAMPLE, [Update("minilm", TUNED)], [record("minilm", 100.0)])
    lines = once.splitlines()
    start = lines.index("models={\\")
    assert lines[start - 4] == HEADER
    assert lines[start - 3].startswith("# tuned minilm: 2026-11-21 07:12 UTC, SLO p99 <= 50 ms: batchSize 4")
    assert "100.0 req/s at p99 45.6 ms (verified; TorchServe defaults 60.1 req/s)" in lines[start - 2]
    assert "benchmarks/reports/tune-minilm-x" in lines[start - 1]
    twice = rewrite(once, [Update("efficientnet_lite0", TUNED)], [record("efficientnet_lite0")])
    again = rewrite(twice, [Update("minilm", TUNED)], [record("minilm", 200.0)])
    assert again.count("# tuned minilm:") == 1 and again.count("# tuned efficientnet_lite0:") == 1
    assert "200.0 req/s" in again and "100.0 req/s" not in again
    assert again.count(HEADER) == 1
    assert outside(again) == outside(SAMPLE)


def test_rewrite_is_idempotent():
    once = rewrite(SAMPLE, [Update("minilm", TUNED)], [record("minilm")])
    assert rewrite(once, [Update("minilm", TUNED)], [record("minilm")]) == once
    assert rewrite(once, []) == once


def test_root_config_round_trip(tmp_path):
    """The real root file: a tuned model changes its four values and nothing else anywhere."""
    text = (DEFAULT_CONFIG).read_text()
    new = rewrite(text, [Update("efficientnet_lite0", TUNED)], [record("efficientnet_lite0")])
    assert outside(new) == outside(text)
    before, after = properties.parse(text), properties.parse(new)
    assert {k: v for k, v in before.items() if k != "models"} == {k: v for k, v in after.items() if k != "models"}
    path = tmp_path / "c.properties"
    path.write_text(new)
    assert ServerConfig.load(path).model("efficientnet_lite0").settings.batch_size == 4


def test_new_model_and_missing_stanza():
    text = "# only a comment\nmetrics_mode=prometheus\n"
    new = rewrite(text, [Update("minilm", TUNED, version="2.0", archive="minilm.mar")], [record("minilm")])
    assert new.startswith(text)
    entry = models_of(new)["minilm"]["2.0"]
    assert entry["defaultVersion"] is True and entry["marName"] == "minilm.mar" and entry["batchSize"] == 4


def test_crlf_and_stanza_in_the_middle():
    text = SAMPLE.replace("\n", "\r\n")
    new = rewrite(text, [Update("minilm", TUNED)])
    assert "\n" not in new.replace("\r\n", "")  # no bare LF introduced
    assert new.endswith("job_queue_size=100\r\n")
    assert properties.parse(new)["job_queue_size"] == "100"


def test_bad_inputs_are_refused():
    with pytest.raises(ConfigWriteError, match="not valid JSON"):
        rewrite("models={oops\n", [Update("minilm", TUNED)])
    with pytest.raises(ConfigWriteError, match="not a valid TorchServe model name"):
        rewrite(SAMPLE, [Update("bad name\\", TUNED)])


def fake_archive(path: Path, config: dict) -> Path:
    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", "{}")
        mar.writestr("model-config.yaml", yaml.safe_dump(config))
    return path


def test_refuses_when_an_archive_overrides_config_properties(tmp_path):
    path = tmp_path / "config.properties"
    path.write_text(SAMPLE)
    clean = fake_archive(tmp_path / "minilm.mar", {"handler": {"weights": "w.safetensors"}})
    bad = fake_archive(tmp_path / "bad.mar", {"batchSize": 16, "maxBatchDelay": 5, "handler": {}})
    check_archives({"minilm": clean})  # no frontend keys: fine
    with pytest.raises(ConfigWriteError) as refused:
        write_config(path, [Update("minilm", TUNED)], [record("minilm")], archives={"minilm": bad})
    message = str(refused.value)
    assert "bad.mar" in message and "batchSize" in message and "maxBatchDelay" in message
    assert "override" in message
    assert path.read_text() == SAMPLE  # nothing written
    with pytest.raises(ConfigWriteError, match="not found"):
        check_archives({"minilm": tmp_path / "missing.mar"})
    write_config(path, [Update("minilm", TUNED)], [record("minilm")], archives={"minilm": clean})
    assert ServerConfig.load(path).model("minilm").settings == TUNED


def test_writing_removes_the_snapshots_a_plain_start_would_load_instead(tmp_path, capsys):
    """`torchserve --start` without --ts-config/--ncs loads the newest logs/config snapshot over the file."""
    path = tmp_path / "config.properties"
    path.write_text(SAMPLE, encoding="utf-8")
    snapshots = tmp_path / "logs" / "config"
    snapshots.mkdir(parents=True)
    stale = [snapshots / "20261123100000000-startup.cfg", snapshots / "20261123110000000-shutdown.cfg"]
    kept = snapshots / "notes.txt"
    for file in (*stale, kept):
        file.write_text("models={}\n", encoding="utf-8")
    write_config(path, [Update("minilm", ModelSettings(batch_size=4, threads=1))])
    assert not any(f.exists() for f in stale) and kept.exists()
    assert "removed 2 TorchServe snapshot(s)" in capsys.readouterr().err


def test_snapshots_follow_log_location(tmp_path):
    folder = snapshot_folder(tmp_path / "config.properties", {"LOG_LOCATION": "elsewhere"})
    assert folder == tmp_path.resolve() / "elsewhere" / "config"


def test_the_plan_is_checked_once_not_again_when_only_provenance_changes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("benchmarks.tune.config_writer.usable_cores", lambda: 1)
    path = tmp_path / "config.properties"
    path.write_text(SAMPLE + "load_models=minilm=minilm.mar\n", encoding="utf-8")
    write_config(path, [Update("minilm", TUNED)], [record("minilm")])
    assert capsys.readouterr().err.count("intra-op threads") == 1  # 2 workers x 1 thread on 1 core
    write_config(path, [Update("minilm", TUNED)], [record("minilm", rps=99.0)], check_plan=False)
    assert "intra-op threads" not in capsys.readouterr().err
