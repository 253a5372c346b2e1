"""The shipped trained weights (models/*/trained/): current with their training code, unchanged since
training, and reproducible: training again reaches the recorded quality. digits and co2 train in
seconds and are retrained here; tinylm takes minutes and is retrained by make test-all (marker slow).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from build import training
from build.errors import CatalogueError
from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit

SCRIPTS = sorted(p.relative_to(REPO_ROOT).as_posix() for p in REPO_ROOT.glob("models/*/train.py"))
# figure -> how far a retrain may land from the recorded one (relative): another CPU sums in another
# order (bf16 autocast where it is native), so the figures move a little, never by these margins.
TOLERANCE = {
    "models/digits/train.py": {"held_out_accuracy": 0.01},
    "models/co2/train.py": {"pinball_ppm": 0.05, "coverage_p10_p90": 0.05},
    "models/tinylm/train.py": {"held_out_perplexity": 0.05},
}


def recorded(script: str) -> dict:
    return json.loads((REPO_ROOT / script).with_name(training.REPORT).read_text(encoding="utf-8"))


def test_every_training_script_ships_its_weights_and_they_check():
    assert set(SCRIPTS) == set(TOLERANCE)
    for script in SCRIPTS:
        path = REPO_ROOT / script
        folder = training.check_shipped(path, REPO_ROOT, script, next(iter(recorded(script)["files"])))
        assert folder == path.parent / training.SHIPPED


def shipped_copy(tmp_path: Path, script: str) -> Path:
    """A copy of the script's folder (code, report, trained/) under tmp_path, as a repository of its own."""
    source = (REPO_ROOT / script).parent
    target = tmp_path / source.relative_to(REPO_ROOT)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / script


def test_a_changed_file_or_changed_code_is_refused_with_the_fix(tmp_path):
    script = shipped_copy(tmp_path, "models/digits/train.py")
    weights = script.parent / training.SHIPPED / training.WEIGHTS
    assert training.check_shipped(script, tmp_path, "m", training.WEIGHTS) == weights.parent
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    with pytest.raises(CatalogueError, match="does not match the sha256"):
        training.check_shipped(script, tmp_path, "m", training.WEIGHTS)
    weights.write_bytes(original)
    script.write_text(script.read_text() + "\n# a change\n")
    with pytest.raises(CatalogueError, match="make retrain SCRIPT=models/digits/train.py"):
        training.check_shipped(script, tmp_path, "m", training.WEIGHTS)


def test_retrain_writes_the_folder_and_a_report_that_checks(tmp_path):
    script = shipped_copy(tmp_path, "models/co2/train.py")
    shutil.rmtree(script.parent / training.SHIPPED)
    (script.parent / training.REPORT).unlink()
    report = training.retrain("models/co2/train.py", tmp_path, progress=lambda _: None)
    assert set(report["files"]) == {training.WEIGHTS}
    assert training.check_shipped(script, tmp_path, "m", training.WEIGHTS) == script.parent / training.SHIPPED
    assert json.loads((script.parent / training.REPORT).read_text()) == report


def reached(script: str, tmp_path: Path) -> dict:
    """The figures of a fresh training, and how far each watched one lands from the record."""
    figures = training.run_training(REPO_ROOT / script, REPO_ROOT, script, tmp_path / "out", progress=lambda _: None)
    record = recorded(script)["figures"]
    return {name: abs(figures[name] - record[name]) / abs(record[name]) for name in TOLERANCE[script]}


@pytest.mark.parametrize("script", ["models/digits/train.py", "models/co2/train.py"])
def test_training_again_reaches_the_recorded_quality(script, tmp_path):
    off = reached(script, tmp_path)
    assert all(off[name] <= TOLERANCE[script][name] for name in off), off


@pytest.mark.slow
def test_the_language_model_trains_again_to_its_recorded_quality(tmp_path):
    off = reached("models/tinylm/train.py", tmp_path)
    assert all(off[name] <= TOLERANCE["models/tinylm/train.py"][name] for name in off), off
