"""The whole tuning pipeline replayed from a committed run's checkpoint, with no server at all.

tune-minilm-20261121-131451 measured the model-guided search, the exhaustive grid of the reduced
space (an option since retired) and a head-to-head: 210 open-loop points on real TorchServes. Resumed from its checkpoint,
the pipeline asks for points in the order today's search wants them, and the checkpoint answers
each one the run measured (a point it did not measure stops the replay). A change to the search's
logic shows here first: if it is meant, this run no longer describes the tuner, and the reports
should be measured again.

It no longer does: the run let unstable points set capacities, and an unstable point now never
passes (benchmarks/load/capacity.py Point.passes). The replay walks the defaults-free search's
first candidate as recorded, then at the second one the point that passed unstable now fails, and
the rate search steps down to a rate the run never measured. Until a run measured under today's
rules is committed, the test pins that divergence; with one, point RUN at it and compare every
SAME section of its report again (as this test did before the rule).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.tune import pipeline
from benchmarks.tune.options import TuneOptions
from benchmarks.tune.results import Point
from build.archive import BuildResult, VariantResult
from serving.repo import REPORTS

pytestmark = pytest.mark.archives

RUN = "tune-minilm-20261121-131451"
# The report sections a run measured under today's rules must reproduce when replayed (not yet one).
SAME = ("search", "chosen", "stop_reason", "fit", "calibrated_model", "first_predictions", "before_after", "timing",
        "space_size")


class Unmeasured(Exception):
    """The replay asked for a point the recorded run never measured."""

    def __init__(self, phase: str, key: str, rate: float) -> None:
        super().__init__(f"the replay asked for a point the recorded run never measured: {phase} {key} at "
                         f"{rate:.3f} req/s")
        self.phase, self.key, self.rate = phase, key, rate


class NoServer:
    """A measurer that has nothing to measure with: the recorded run must answer every point."""

    def __init__(self, plan, progress) -> None:
        self.conditions = []

    def __enter__(self) -> NoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def measure(self, phase, candidate, rate):
        raise Unmeasured(phase, candidate.key, rate)

    def finish(self) -> None:
        pass


def _built(catalogue, model, root, store, progress=None) -> BuildResult:
    """The build the replay needs: the default archive's name (no archive is read, none is built)."""
    # The run served <model>.mar before variants existed: the default archive, whichever variant it is now.
    variant = VariantResult(catalogue.entry(model).default_variant.name, Path(store) / f"{model}.mar", "passed", None,
                            0.0, {}, False)
    return BuildResult(model, variant.archive, False, 0.0, (variant,))


def _replay(tmp_path: Path, monkeypatch) -> None:
    folder = shutil.copytree(REPORTS / RUN, tmp_path / RUN)
    saved = json.loads((folder / "checkpoint.json").read_text())
    # The run predates these options; what it did is what they now say: fixed windows, whatever the
    # rate, and capacity alone choosing (no shorter-delay point).
    saved["identity"].update(point_requests=0, tie_pct=0, verify_points=1, verify_warmup_s=10.0)
    (folder / "checkpoint.json").write_text(json.dumps(saved))
    options = TuneOptions.from_record(saved["identity"], folder)
    assert not options.steps.write  # nothing gets written anywhere
    monkeypatch.setattr(pipeline, "build_entry", _built)
    pipeline.tune_model(options, lambda line: None, serve_with=NoServer)


def test_committed_run_replays_until_an_unstable_point_no_longer_passes(tmp_path, monkeypatch):
    with pytest.raises(Unmeasured) as stopped:
        _replay(tmp_path, monkeypatch)
    # The first candidate replays as measured; the second steps down from 157.6 req/s, where the
    # run recorded a pass, to a rate it never measured.
    assert (stopped.value.phase, stopped.value.key) == ("search", "w1-t2-b8-d2")
    assert stopped.value.rate == pytest.approx(126.07, abs=0.01)
    recorded = json.loads((REPORTS / RUN / "checkpoint.json").read_text())["points"]
    cause = Point.from_json(recorded["search|w1-t2-b8-d2|157.587138"])
    assert cause.p99_ms <= 50.0 and cause.errors == 0 and not cause.stable  # passed then, unstable
    assert not cause.passes(50.0)
