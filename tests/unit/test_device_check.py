"""The device check (python -m benchmarks.bench.device_check) on the tiny models: packed for a
device machine with their weights dropped, then run on the CPU and on a virtual cuda:0
(tests/device_audit.py), so a tensor on the wrong side fails it here. Its report is complete, every
agreement holds (the virtual device is the CPU underneath), and a budget too small names what it
left out."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench import device_check
from tests.device_audit import virtual_cuda

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def pack(tiny_catalogue, tiny_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("pack") / "pack"
    store = tiny_catalogue.parent.parent / "store"
    assert device_check.main(["--catalogue", str(tiny_catalogue), "--model-store", str(store), "--pack", str(folder),
                              "--max-weights-mib", "0"]) == 0
    return folder


def run(tiny_catalogue, pack, out, *more) -> dict:
    with virtual_cuda():
        code = device_check.main(["--catalogue", str(tiny_catalogue), "--from-pack", str(pack), "--devices", "cpu,cuda",
                                  "--batch-sizes", "1,4", "--seconds", "0.05", "--streams", "3", "--lm-tokens", "8",
                                  "--out", str(out),
                                  *more])
    assert code == 0
    (folder,) = list(out.iterdir())
    assert {p.name for p in folder.iterdir()} >= {"report.json", "report.md"}
    return json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module")
def full(tiny_catalogue, pack, tmp_path_factory) -> tuple[dict, object]:
    """One run of every model on both devices (the tests below read its report) and its folder."""
    out = tmp_path_factory.mktemp("full")
    return run(tiny_catalogue, pack, out), next(out.iterdir())


def test_every_family_on_both_devices_agrees_and_is_timed(pack, full):
    assert (pack / "tiny_text" / device_check.RANDOM_WEIGHTS).is_file()
    report, folder = full
    assert (folder / "throughput.png").stat().st_size > 0
    assert report["budget"]["left_out"] == []
    families = {r["family"] for r in report["results"]}
    assert families == {"image_classifier", "text_embedder", "tensor", "quantile_forecaster", "causal_lm"}
    for result in report["results"]:
        assert {a["device"] for a in result["agreement"]} == {"cpu", "cuda"}, result["model"]
        assert all(a["passed"] is not False for a in result["agreement"]), result["agreement"]
        assert all(a["passed"] for a in result["agreement"] if a["precision"] == "fp32"), result["agreement"]
        assert {r["device"] for r in result["rows"]} == {"cpu", "cuda"}
    image = next(r for r in report["results"] if r["family"] == "image_classifier")
    assert {(r["precision"], r["batch_size"]) for r in image["rows"] if r["device"] == "cuda"} == {
        ("fp32", 1), ("fp32", 4), ("bf16", 1), ("bf16", 4)}
    assert all(r["handler_items_per_s"] > 0 and r["bare_items_per_s"] > 0 for r in image["rows"])
    assert any(t["what"] == "tokens/s cuda/cpu" and t["measured"] for t in report["targets"])


def test_a_budget_too_small_names_what_it_left_out(tiny_catalogue, pack, tmp_path):
    report = run(tiny_catalogue, pack, tmp_path, "--budget-min", "0.01", "--model", "tiny_image")
    assert report["budget"]["left_out"] and report["budget"]["left_out"][0].startswith("tiny_image on cpu fp32")


def test_a_model_that_fails_costs_its_own_rows_only(tiny_catalogue, pack, tmp_path, monkeypatch):
    real = device_check.check_model

    def broken_for_image(plan, model, folder, budget):
        if model == "tiny_image":
            raise ValueError("made to fail")
        return real(plan, model, folder, budget)

    monkeypatch.setattr(device_check, "check_model", broken_for_image)
    report = run(tiny_catalogue, pack, tmp_path, "--model", "tiny_image", "--model", "tiny_tensor")
    image, tensor = report["results"]
    assert image["rows"] == [] and image["errors"] == ["setting up: ValueError: made to fail"]
    assert tensor["errors"] == [] and tensor["rows"] and all(a["passed"] for a in tensor["agreement"])
    assert "## Failed" in next(tmp_path.iterdir()).joinpath("report.md").read_text()


def test_each_row_says_what_ran(full):
    (image,) = [r for r in full[0]["results"] if r["model"] == "tiny_image"]
    assert image["runs"] == "eager, random weights"
    assert {(r["device"], r["precision"], r["tf32"]) for r in image["rows"]} == {
        ("cpu", "fp32", False), ("cpu", "bf16", False), ("cuda", "fp32", True), ("cuda", "bf16", True)} - (
        set() if device_check.precisions("cpu") == ("fp32", "bf16") else {("cpu", "bf16", False)})


def _as_aoti_default(pack, tmp_path):
    """The packed tiny_image as the pack carries an AOTInductor default: its eager form without
    weights, the aoti variant's settings beside it."""
    import shutil

    import yaml

    from benchmarks.bench.device_check_pack import SERVED_CONFIG

    folder = tmp_path / "tiny_image"
    shutil.copytree(pack / "tiny_image", folder)
    config = yaml.safe_load((folder / "model-config.yaml").read_text())
    aoti = {**config, "handler": {**config["handler"], "variant": "aoti", "weights": "model.pt2",
                                  "runtime": {**config["handler"]["runtime"], "graph": "aoti", "device": "cpu"}}}
    aoti["handler"].pop("source", None)  # a serialised variant carries none
    (folder / SERVED_CONFIG).write_text(yaml.safe_dump(aoti))
    (folder / device_check.RANDOM_WEIGHTS).write_text(json.dumps({"dropped": "model.pt2", "how": "re-made from source"}))
    return folder


def test_an_aoti_default_is_compiled_again_on_the_checking_machine(pack, tmp_path, monkeypatch):
    """A package runs on the CPU and torch that compiled it: the check exports and compiles it again
    from the random model there (the real compile: tests/archives), or runs eager saying why not."""
    import yaml

    from benchmarks.bench.device_check_pack import random_weights
    from build import aoti_export
    from build.errors import ExportError

    compiled = []

    def compile_here(model, example, target, dtype, where):
        compiled.append((type(model).__name__, tuple(example[0].shape), target.name))
        target.write_bytes(b"package")
        return target

    monkeypatch.setattr(aoti_export, "export_aoti", compile_here)
    folder = _as_aoti_default(pack, tmp_path / "ok")
    assert random_weights(folder) == "aoti, exported and compiled here from random weights"
    assert compiled and compiled[0][2] == "model.pt2"
    assert yaml.safe_load((folder / "model-config.yaml").read_text())["handler"]["runtime"]["graph"] == "aoti"

    def no_compiler(*args):
        raise ExportError("tiny_image variant aoti: AOTInductor needs a C++ compiler at build time and none is on PATH")

    monkeypatch.setattr(aoti_export, "export_aoti", no_compiler)
    folder = _as_aoti_default(pack, tmp_path / "refused")
    runs = random_weights(folder)
    assert runs.startswith("eager in place of aoti (") and "needs a C++ compiler" in runs
    assert yaml.safe_load((folder / "model-config.yaml").read_text())["handler"]["runtime"].get("graph", "eager") == "eager"


def test_an_archive_that_runs_on_the_cpu_says_why_it_has_no_gpu_rows(tiny_catalogue, pack, tmp_path):
    import shutil

    import yaml

    copy = tmp_path / "pack"
    shutil.copytree(pack, copy)
    config_file = copy / "tiny_tensor" / "model-config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["handler"]["runtime"]["device"] = "cpu"
    config_file.write_text(yaml.safe_dump(config))
    report = run(tiny_catalogue, copy, tmp_path / "out", "--model", "tiny_tensor")
    (tensor,) = report["results"]
    assert {r["device"] for r in tensor["rows"]} == {"cpu"} and tensor["errors"] == []
    assert tensor["skipped"][0].startswith("cuda: the archive runs on the CPU")
    assert "## Not run (and why)" in next((tmp_path / "out").iterdir()).joinpath("report.md").read_text()
