"""The device check on the archives `make build` writes: its pack fits the device tool whatever the
default variants are (minilm's TorchScript is re-made from its source with random weights and traced
again at check time), and the check run from that pack answers every example (digits' .npy ones
with their content type) on the CPU and the virtual cuda:0 (tests/device_audit.py)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench import device_check
from benchmarks.bench.device_check_pack import LIMIT_MIB, RANDOM_WEIGHTS, folder_mib
from serving.repo import CATALOGUE, MODEL_STORE
from tests.device_audit import virtual_cuda

pytestmark = pytest.mark.archives


@pytest.fixture(scope="module")
def pack(archive_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("device-pack") / "pack"
    assert device_check.main(["--catalogue", str(CATALOGUE), "--model-store", str(MODEL_STORE), "--pack", str(folder)]) == 0
    return folder


def check(pack, out, *args) -> dict:
    with virtual_cuda():
        code = device_check.main(["--catalogue", str(CATALOGUE), "--from-pack", str(pack), "--batch-sizes", "1,4",
                                  "--seconds", "0.05", "--out", str(out), *args])
    assert code == 0
    (folder,) = list(out.iterdir())
    return json.loads((folder / "report.json").read_text())


def test_the_pack_fits_the_device_tool(pack):
    assert folder_mib(pack) < LIMIT_MIB
    marker = json.loads((pack / "minilm" / RANDOM_WEIGHTS).read_text())
    assert marker["how"] == "re-made from source" and not (pack / "minilm" / "model.ts").exists()


def test_digits_examples_are_answered_on_both_devices(pack, tmp_path):
    report = check(pack, tmp_path, "--model", "digits", "--devices", "cpu,cuda")
    (digits,) = report["results"]
    assert digits["errors"] == []
    assert {a["device"] for a in digits["agreement"]} == {"cpu", "cuda"}
    for row in digits["agreement"]:
        assert row["passed"], row  # a refused example (no content type: a 400 on both devices) fails here
    assert all(r["tf32"] is (r["device"] == "cuda") for r in digits["rows"])


def test_a_remade_torchscript_runs_its_graph_at_its_traced_precision(pack, tmp_path):
    report = check(pack, tmp_path, "--model", "minilm", "--devices", "cpu")
    (minilm,) = report["results"]
    assert minilm["errors"] == [] and minilm["runs"].startswith("torchscript, re-traced")
    assert [(a["variant"], a["graph"]) for a in minilm["agreement"]] == [("torchscript", "torchscript")]
    assert minilm["agreement"][0]["passed"]
