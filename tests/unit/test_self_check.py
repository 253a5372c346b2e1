"""A variant proves itself on the machine that serves it (handlers/self_check.py): the build packs a
few held-out inputs and fp32's outputs for them into the archive, and the worker refuses to load
when the variant, run here, falls outside the gate's bound on them. Seen failing with perturbed
archives of the tiny models (tests/tiny.py): weights changed after the gate, or the packed reference."""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
import yaml

from build.__main__ import main as build_main
from build.catalogue import parse_entry
from build.errors import CatalogueError
from build.gate import GateSpec
from handlers import self_check
from handlers.errors import ConfigError
from serving.fake_context import extract
from tests.tiny import catalogue_entries

from .conftest import make_handler

pytestmark = pytest.mark.unit

KINDS = {"tiny_text": "min cosine", "tiny_image": "top-1 agreement", "tiny_forecast": "max tolerance ratio"}
QUICK = ("--speed-seconds", "0.01")


@pytest.fixture
def copy_of(tiny_dirs, tmp_path):
    """A private copy of a tiny model's extracted archive (the session's copies stay intact)."""
    def copy(name: str):
        return shutil.copytree(tiny_dirs[name], tmp_path / name)
    return copy


def packed(model_dir) -> dict:
    return json.loads((model_dir / self_check.FILE).read_text())


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_variant_loads_when_its_self_check_holds_and_refuses_a_perturbed_reference(copy_of, caplog, name):
    model_dir = copy_of(name)
    data = packed(model_dir)
    assert data["model"] == name and data["inputs"] and len(data["reference"]) == len(data["inputs"])
    caplog.set_level(logging.INFO, logger="handlers.self_check")
    make_handler(model_dir, name)
    passed = [r.getMessage() for r in caplog.records if "self-check passed" in r.getMessage()]
    assert passed and KINDS[name] in passed[0] and " ms: " in passed[0], caplog.text

    data["reference"] = (-np.asarray(data["reference"])).tolist()  # what fp32 answered, negated
    (model_dir / self_check.FILE).write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"{name} \(variant eager\) refused to load: .*{KINDS[name]}"):
        make_handler(model_dir, name)


def test_perturbed_weights_refuse_to_load_naming_the_figure_the_bound_and_the_fix(copy_of):
    """The archive's weights changed after its gate (as another CPU's int8 kernels change its answers)."""
    model_dir = copy_of("tiny_text")
    state = torch.load(model_dir / "model.pt", weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for tensor in state.values():
        if tensor.is_floating_point():
            tensor.add_(torch.randn(tensor.shape, generator=generator) * tensor.abs().mean() * 3)
    torch.save(state, model_dir / "model.pt")
    with pytest.raises(ConfigError) as refused:
        make_handler(model_dir, "tiny_text")
    message = refused.value.message
    assert "tiny_text (variant eager) refused to load: its self-check on this machine measured min cosine" in message
    figure = float(message.split("min cosine ")[1].split()[0])
    assert figure < 0.99 and "(needs >= 0.99)" in message, message
    assert "the build measured 1.0000 on " in message and "this is " in message
    assert "serve a variant of tiny_text that passes here" in message and "make build" in message


def test_the_build_packs_the_held_out_inputs_nearest_the_bound(tiny_catalogue, tmp_path, capsys, caplog):
    project, mine = tiny_catalogue.parent, tiny_catalogue.parent / tmp_path.name
    mine.mkdir()
    np.save(mine / "scans.npy", np.random.default_rng(0).uniform(0, 16, (12, 1, 4, 4)).astype(np.float32))
    entry = {k: v for k, v in catalogue_entries()["tiny_tensor"].items() if k != "serialisation"}
    entry.update(variants=["eager", "onnx"], gate={"held_out": [{"path": f"{tmp_path.name}/scans.npy"}],
                                                   "self_check": 3})
    catalogue = project / f"{tmp_path.name}.yaml"
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    store = tmp_path / "store"
    assert build_main(["--catalogue", str(catalogue), "--out", str(store), *QUICK]) == 0, capsys.readouterr()
    assert "tiny onnx: self-check packed: top-1 agreement 1.0000 (needs >= 1) on 3 held-out" in capsys.readouterr().out
    onnx = extract(store / "tiny.onnx.mar", tmp_path / "onnx")
    data = packed(onnx)
    assert data["variant"] == "onnx" and data["kind"] == "classification" and data["build_figure"] == 1.0
    assert [item["name"][:10] for item in data["inputs"]] == ["scans.npy["] * 3  # held out, not the examples
    assert data["built_on"] == self_check.host()

    entry["gate"]["self_check"] = 0  # none packed: the worker says so and loads
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": entry}}))
    assert build_main(["--catalogue", str(catalogue), "--out", str(tmp_path / "none"), *QUICK]) == 0
    bare = extract(tmp_path / "none" / "tiny.onnx.mar", tmp_path / "bare")
    assert not (bare / self_check.FILE).exists()
    caplog.set_level(logging.INFO, logger="handlers.self_check")
    make_handler(bare, "tiny")
    assert "tiny onnx: no self-check in this archive" in caplog.text


@pytest.mark.parametrize("value", [-1, 33, True, "5", 2.5])
def test_the_gate_names_a_bad_self_check_count(value):
    with pytest.raises(CatalogueError, match=r"m.gate.self_check: .* an integer in \[0, 32\]"):
        GateSpec.parse("m.gate", {"self_check": value})


def test_an_entry_packs_five_inputs_under_its_gate_bounds_by_default():
    entry = parse_entry("tiny_tensor", catalogue_entries()["tiny_tensor"])
    assert entry.gate.self_check == 5 and entry.gate.bounds == self_check.Bounds()


def test_a_request_of_several_rows_is_one_input_judged_by_its_worst_row():
    """A forecaster request of two series answers two rows: the gate and the self-check count inputs."""
    from build.gate import GateInput, judge

    reference = torch.arange(1.0, 25.0).reshape(4, 3, 2)
    candidate = reference.clone()
    candidate[2] += 1.0  # the second series of the second request
    inputs = [GateInput("one", {}, "application/json"), GateInput("two series", {}, "application/json"),
              GateInput("three", {}, "application/json")]
    verdict = judge("tensor", GateSpec(), reference, candidate, inputs, owners=(0, 1, 1, 2))
    assert not verdict.passed and verdict.worst_input == "two series" and verdict.order[0] == 1
    found = self_check.agreement("tensor", self_check.Bounds(), reference, candidate).by_input((0, 1, 1, 2))
    assert found.ok.tolist() == [True, False, True] and found.worst == 1
