"""The whole tuning pipeline replayed from a committed run's checkpoint, with no server at all.

tune-minilm-20261121-131451 measured the model-guided search, the exhaustive grid of the reduced
space and a head-to-head: 210 open-loop points on real TorchServes. Resumed from its checkpoint,
the pipeline must ask for exactly those points (a point it did not measure then fails the test)
and reach the same choices and figures. A change to the search's logic shows here first: if it
is meant, this run no longer describes the tuner, and the reports should be measured again.
"""

from __future__ import annotations

import json
import shutil

import pytest

from serving.repo import REPORTS
from benchmarks.tune.options import TuneOptions
from benchmarks.tune.pipeline import tune_model

pytestmark = pytest.mark.archives

RUN = "tune-minilm-20261121-131451"
SAME = ("search", "chosen", "stop_reason", "fit", "calibrated_model", "first_predictions", "grid", "grid_comparison",
        "before_after", "timing", "space_size")


class NoServer:
    """A measurer that has nothing to measure with: the recorded run must answer every point."""

    def __init__(self, plan, progress) -> None:
        self.conditions = []

    def __enter__(self) -> "NoServer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def measure(self, phase, candidate, rate):
        raise AssertionError(f"the replay asked for a point the recorded run never measured: {phase} "
                             f"{candidate.key} at {rate:.3f} req/s")

    def finish(self) -> None:
        pass


def test_committed_run_replays_point_for_point(tmp_path, model_store):
    folder = shutil.copytree(REPORTS / RUN, tmp_path / RUN)
    recorded = json.loads((folder / "report.json").read_text())
    saved = json.loads((folder / "checkpoint.json").read_text())
    # The run predates these options; what it did is what they now say: fixed windows, whatever the
    # rate, and capacity alone choosing (no shorter-delay point).
    saved["identity"].update(point_requests=0, tie_pct=0, verify_points=1, verify_warmup_s=10.0)
    (folder / "checkpoint.json").write_text(json.dumps(saved))
    record = saved["identity"]
    options = TuneOptions.from_record(record, folder)
    assert not options.steps.write and options.steps.grid  # nothing gets written anywhere
    assert tune_model(options, lambda line: None, serve_with=NoServer) == 0
    replayed = json.loads((folder / "report.json").read_text())
    for key in SAME:
        assert replayed[key] == recorded[key], key
    assert replayed["grid_comparison"]["targets_met"] and replayed["grid_comparison"]["head_to_head"]
