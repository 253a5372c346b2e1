"""The tuner's options: read once from the command line (or a checkpoint's record) into frozen
dataclasses; unknown keys and out-of-range values are refused, naming the option."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.tune.command import parser
from benchmarks.tune.errors import TuneError
from benchmarks.tune.options import TuneOptions, record_of
from serving.repo import REPO_ROOT

pytestmark = pytest.mark.unit


def record(*argv: str) -> dict:
    return record_of(vars(parser().parse_args(list(argv))), "minilm", 50.0, cores=2)


def test_a_record_builds_each_steps_options(tmp_path):
    options = TuneOptions.from_record(record("--space", "reduced", "--no-write", "--rate-step", "1.5",
                                             "--window-s", "3"), tmp_path / "run", wait_quiet_s=60)
    assert options.space.batch_sizes == (1, 2, 4, 8) and options.space.cores == 2
    assert options.search.rates.step == 1.5 and options.load.window_s == 3.0
    assert (options.steps.write, options.steps.verify, options.steps.defaults) == (False, True, True)
    assert options.config == REPO_ROOT / "config.properties"  # recorded relative, read as the repo's
    assert options.record["config"] == "config.properties" and options.wait_quiet_s == 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.slo_ms = 10.0


@pytest.mark.parametrize("argv, words", [
    (["--rate-step", "1.0"], "--rate-step must be a number above 1"),
    (["--rate-resolution", "0.9"], "--rate-resolution must be a number above 1"),
    (["--window-s", "0"], "--window-s must be a number above 0"),
    (["--max-points", "0"], "--max-points must be a number at least 1"),
    (["--warmup-s", "-1"], "--warmup-s must be a number at least 0"),
    (["--verify-stability-pct", "0"], "--verify-stability-pct must be a number above 0"),
    (["--space", "huge"], "--space 'huge'"),
])
def test_out_of_range_values_name_the_option(tmp_path, argv, words):
    raw = record()
    # argparse lets these through (choices aside): the record is checked like a resumed one.
    if argv[0] == "--space":
        raw["space"] = argv[1]
    else:
        raw[argv[0][2:].replace("-", "_")] = float(argv[1])
    with pytest.raises(TuneError, match=words):
        TuneOptions.from_record(raw, tmp_path)


def test_unknown_and_missing_keys_are_refused(tmp_path):
    raw = record()
    with pytest.raises(TuneError, match=r"unknown \['colour'\]"):
        TuneOptions.from_record({**raw, "colour": "blue"}, tmp_path)
    assert TuneOptions.from_record({**raw, "grid": True}, tmp_path).record["grid"]  # a retired option: read past
    del raw["tie_pct"]
    with pytest.raises(TuneError, match=r"missing \['tie_pct'\]"):
        TuneOptions.from_record(raw, tmp_path)


def test_the_verification_takes_its_own_stability_rule(tmp_path):
    assert TuneOptions.from_record(record("--verify-stability-pct", "40"), tmp_path).verify.stability_pct == 40.0
    older = record()
    del older["verify_stability_pct"]  # a checkpoint written before the option: the benchmark's rule
    resumed = TuneOptions.from_record(older, tmp_path)
    assert resumed.verify.stability_pct == 10.0
    assert dict(resumed.record) == older  # its checkpoint's identity still matches


def test_a_gpu_tune_searches_the_gpu_space_and_says_so_in_its_record(tmp_path):
    options = TuneOptions.from_record(record("--device", "cuda"), tmp_path / "run")
    assert options.device == "cuda" and options.record["space"] == "gpu" and options.record["device"] == "cuda"
    assert max(options.space.batch_sizes) == 256 and options.space.workers == (1, 2)  # 4 needs 4 cores here
    cpu = TuneOptions.from_record(record(), tmp_path / "cpu")
    assert (cpu.device, cpu.record["space"], max(cpu.space.batch_sizes)) == ("cpu", "full", 32)
    older = {k: v for k, v in record().items() if k != "device"}  # a checkpoint from before the option
    assert TuneOptions.from_record(older, tmp_path / "old").device == "cpu"
    with pytest.raises(TuneError, match="--device 'tpu'"):
        TuneOptions.from_record({**record(), "device": "tpu"}, tmp_path / "bad")
