"""The build of the real EfficientNet-Lite0 entry, traced to TorchScript: what it serves is still
ImageNet's answer on real photos (seconds of tracing; the build's mechanics: tests/unit/test_build.py)."""

from pathlib import Path

import pytest
import yaml

from build.__main__ import main as build_main
from serving.repo import CATALOGUE
from tests.archived import archived, gate_rejection
from tests.references import CAT_LABELS, decoded

pytestmark = pytest.mark.archives

IMAGE = {**{k: v for k, v in yaml.safe_load((CATALOGUE).read_text())["models"]["efficientnet_lite0"].items()
            if k not in ("variants", "gate")}, "serialisation": "state_dict"}


def write_catalogue(tmp_path: Path, **entries) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return path


def run_build(catalogue: Path, store: Path, capsys, *extra):
    code = build_main(["--catalogue", str(catalogue), "--out", str(store), *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def with_changes(**changes):
    entry = yaml.safe_load(yaml.safe_dump(IMAGE))
    entry.update(changes)
    return entry


def test_torchscript_export_serves_the_same_answers(tmp_path, capsys, photos):
    from serving.fake_context import extract

    from .conftest import make_handler

    entry = with_changes(serialisation="torchscript", settings={**IMAGE["settings"], "runtime": {"precision": "fp32"}})
    store = tmp_path / "store"
    assert run_build(write_catalogue(tmp_path, ts=entry), store, capsys)[0] == 0
    model_dir = extract(store / "ts.mar", tmp_path / "ts")
    handler, context = make_handler(model_dir, "ts")
    assert handler.settings.runtime.graph == "torchscript"
    cat, coffee = decoded(handler.handle([{"body": photos["cat"]}, {"body": photos["coffee"]}], context))
    assert max(coffee, key=coffee.get) == "espresso"
    assert max(cat, key=cat.get) in CAT_LABELS


def test_every_built_archive_declares_where_it_runs(model_store):
    """On a GPU host TorchServe hands a gpu_id to every worker unless the archive says deviceType: cpu:
    the ONNX archives (ONNX Runtime's CPU package) say so; the torch ones leave it to TorchServe."""
    import zipfile

    from build.catalogue import Catalogue

    catalogue = Catalogue.load(CATALOGUE)
    seen = {}
    for name in catalogue.names:
        for variant in catalogue.entry(name).variants:
            if gate_rejection(model_store, name, variant.name):  # this host's gate rejected it (minilm's int8)
                continue
            archive = archived(model_store, name, variant.name)
            with zipfile.ZipFile(archive) as mar:
                config = yaml.safe_load(mar.read("model-config.yaml"))
            seen[archive.name] = (config.get("deviceType"), config["handler"]["runtime"].get("device", "auto"))
    assert seen["minilm.onnx.mar"] == ("cpu", "cpu") and seen["efficientnet_lite0.onnx.mar"] == ("cpu", "cpu")
    assert seen["minilm.mar"] == ("cpu", "cpu")  # AOTInductor, compiled for this CPU
    assert seen["minilm.torchscript.mar"] == (None, "auto") and seen["tinylm.mar"] == (None, "auto")
    assert all(device == "cpu" for archive, (device, _) in seen.items() if ".onnx" in archive), seen


def test_a_traced_graphs_cpu_constants_are_moved_to_the_serving_device(tmp_path):
    """minilm's TorchScript, traced on the CPU, holds `cpu` as a constant (transformers' mask code
    makes tensors on the input's device at trace time): on a GPU they would stay on the host. The
    worker's loader moves every one to the serving device (handlers/device.py)."""
    import torch

    from benchmarks.bench.inprocess import extracted_archive
    from handlers import device

    module = torch.jit.load(str(extracted_archive("minilm", "torchscript", tmp_path) / "model.ts"))
    assert "cpu" in device.device_constants(module)
    moved = device.retarget_device_constants(module, torch.device("cuda", 0))
    assert moved >= 1 and set(device.device_constants(module)) == {"cuda:0"}
